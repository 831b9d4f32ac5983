//! vgpu-serve: serving plumbing shared by the vgpu binaries (the extender today; the webhook and the device
//! monitor next), so that no component carries its own copy.
//!
//! Nothing is here yet; the modules land with the issue that lifts them.
