//! Small private helpers.

use std::fmt;

/// Shows bytes as a string where printable, escaped otherwise, cut at 64.
pub(crate) struct DebugBytes<'a>(pub &'a [u8]);

impl fmt::Debug for DebugBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.0[..self.0.len().min(64)];
        write!(f, "b\"{}\"", shown.escape_ascii())?;
        if self.0.len() > 64 {
            write!(f, "..({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}
