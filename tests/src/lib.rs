//! Helpers shared by Tributary's end-to-end tests.
