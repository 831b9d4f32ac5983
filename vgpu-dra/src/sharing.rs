//! Being built (issue #18); see the module map in the crate docs.
