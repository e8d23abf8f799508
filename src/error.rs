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

/// The first line of a message: libtorch's errors append a C++ stack trace after it.
pub fn first_line(msg: &str) -> &str {
    let line = msg.lines().next().unwrap_or("").trim_end();
    line.split(" (Exception raised from").next().unwrap_or(line)
}

/// A panic (a bug) then ends in one line that says where, not in a backtrace.
pub fn report_panics_in_one_line() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal error{at}: {} (please report it)", first_line(&msg));
    }));
}
