//! vgpu monitor (work in progress; see the crate description).

#![cfg_attr(docsrs, feature(doc_cfg))]
