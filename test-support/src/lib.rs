//! What Tributary's tests share (`tributary_test_support`). Never a
//! dependency of a shipped binary.
#![warn(missing_docs)]

pub mod certs;
pub mod fault_proxy;
pub mod moto;
pub mod ports;
pub mod process;
pub mod relay;
