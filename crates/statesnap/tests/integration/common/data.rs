//! Deterministic data shared by the tests (`common::data`) and the benches
//! (`#[path = "../tests/integration/common/data.rs"] mod data;`).
#![allow(dead_code)]

use bytes::Bytes;

/// The key of user `i`: `user:0000000042`.
pub fn user_key(i: u64) -> Bytes {
    Bytes::from(format!("user:{i:010}"))
}

/// 100 bytes, distinct per (user, generation), mildly compressible.
pub fn user_value(i: u64, generation: u64) -> Bytes {
    let mut v = Vec::with_capacity(100);
    let mut x =
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ generation.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    while v.len() < 100 {
        x ^= x >> 31;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        v.extend_from_slice(&x.to_le_bytes()[..4]);
        v.extend_from_slice(b"abcd");
    }
    v.truncate(100);
    Bytes::from(v)
}
