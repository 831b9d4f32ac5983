//! vgpu-node-agent: GPU module node agent (being built, issue #20).
