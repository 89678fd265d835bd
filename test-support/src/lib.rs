//! What Tributary's tests share (`tributary_test_support`). Never a
//! dependency of a shipped binary.

pub mod metadata_suite;
