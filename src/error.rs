//! User mistakes (bad flags, missing data) versus failures of the program itself.
//! A `UserError` anywhere in an error chain makes the binary print one line and exit with 2.
use std::fmt;

#[derive(Debug)]
pub struct UserError(pub String);

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

/// `bail_user!("...")` returns early with a UserError.
#[macro_export]
macro_rules! bail_user {
    ($($arg:tt)*) => { return Err(anyhow::Error::new($crate::error::UserError(format!($($arg)*)))) };
}

pub fn user_error(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UserError(msg.into()))
}

pub fn is_user_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<UserError>())
}
