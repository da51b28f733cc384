//! Helpers shared by the integration tests (each file under `tests/` is its own crate and
//! declares `mod common;`). Not every binary uses every helper.

#![allow(dead_code)]

pub mod chaos;
pub mod counting_alloc;
