//! The embedded segmented file changelog (work in progress).
