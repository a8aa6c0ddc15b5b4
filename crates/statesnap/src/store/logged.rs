//! LoggedStore (work in progress).
