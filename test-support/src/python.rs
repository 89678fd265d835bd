//! A python3 with the packages a read-back test needs (pyarrow, duckdb),
//! named by `TRIB_TEST_PYTHON`. The tests that use it fail, naming the tool
//! and how to get it, when it is missing (`./scripts/test` and `.ci/run`
//! install it into a venv at /tmp/tributary-py).

use std::path::PathBuf;
use std::process::Command;

/// The variable naming the python interpreter.
pub const PYTHON_ENV: &str = "TRIB_TEST_PYTHON";

/// The pinned packages `./scripts/test` installs.
pub const PACKAGES: &str = "'pyarrow==26.0.1' 'duckdb==2.0.1'";

/// The interpreter [`PYTHON_ENV`] names, checked to import every module of
/// `modules`.
///
/// # Panics
/// If the variable is unset or the interpreter cannot import a module: the
/// message says how to install them.
pub fn python_with(modules: &[&str]) -> PathBuf {
    let how = format!(
        "run the tests with ./scripts/test (it installs them), or: \
         python3 -m venv /tmp/tributary-py && /tmp/tributary-py/bin/pip install {PACKAGES} && \
         export {PYTHON_ENV}=/tmp/tributary-py/bin/python"
    );
    let Some(python) = std::env::var_os(PYTHON_ENV) else {
        panic!(
            "this test reads files back with python ({}) and {PYTHON_ENV} is not set: {how}",
            modules.join(", ")
        );
    };
    let python = PathBuf::from(python);
    let import = format!("import {}", modules.join(", "));
    let out = Command::new(&python)
        .args(["-c", &import])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({PYTHON_ENV}): {e}", python.display()));
    assert!(
        out.status.success(),
        "{} ({PYTHON_ENV}) cannot `{import}`: {}; {how}",
        python.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    python
}
