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

/// A user error no skipping may hide: the data could not be fetched from where it lies (an
/// object store's or a web server's), so the loader stops the run instead of passing over the
/// sample as an unreadable image, even without `--strict`.
#[derive(Debug)]
pub struct Unfetchable(pub UserError);

impl fmt::Display for Unfetchable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Unfetchable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

pub fn unfetchable(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Unfetchable(UserError(msg.into())))
}

pub fn is_unfetchable(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Unfetchable>())
}

/// The first line of a message: libtorch's errors append a C++ stack trace after it, and Gloo's
/// start with the source file that raised them (`[/pytorch/third_party/gloo/...cc:78] `).
pub fn first_line(msg: &str) -> String {
    let line = msg.lines().next().unwrap_or("").trim_end();
    let line = line.split(" (Exception raised from").next().unwrap_or(line);
    without_source_locations(line)
}

/// `msg` less every `[path/file.cc:NN] ` a C++ library put in it.
fn without_source_locations(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(start) = rest.find('[') {
        let Some(len) = rest[start..].find("] ") else { break };
        let inside = &rest[start + 1..start + len];
        let is_location = inside.contains('/')
            && [".cc:", ".cpp:", ".h:", ".hpp:"].iter().any(|ext| inside.contains(ext))
            && !inside.contains(' ');
        out.push_str(&rest[..start]);
        if !is_location {
            out.push_str(&rest[start..start + len + 2]);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_lines_lose_stack_traces_and_source_locations() {
        assert_eq!(
            first_line("all-reduce failed: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete\nmore"),
            "all-reduce failed: Timed out waiting 20000ms for recv operation to complete"
        );
        assert_eq!(first_line("bad value (Exception raised from f at x.cpp:3)"), "bad value");
        assert_eq!(first_line("[rank 1] kept [as is] "), "[rank 1] kept [as is]");
    }
}
