//! Exit codes of SPEC §1.

pub const OK: i32 = 0;
pub const FAILURE: i32 = 1;
pub const BAD_CONFIG: i32 = 2;
pub const NOT_FOUND: i32 = 3;
