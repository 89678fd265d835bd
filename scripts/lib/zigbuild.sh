# Sourced by scripts/build-edge-static and scripts/package: cross builds of
# static musl binaries with cargo-zigbuild (zig as C compiler and linker,
# zig from the PyPI package `ziglang` in a venv), so no musl cross
# toolchain is needed.
#
# zigbuild_setup TARGET installs what is missing (the Rust target,
# cargo-zigbuild, the venv with ziglang, a 100 MB download), puts zig on
# PATH and sets ZIGBUILD_ARGS (extra `cargo zigbuild` arguments, maybe
# empty). When rustup cannot download the target's standard library (some
# mirrors serve no rust-std for armv7-unknown-linux-musleabihf: a 404), std
# is built from the `rust-src` component instead (`-Z build-std`, allowed on
# the stable toolchain by RUSTC_BOOTSTRAP=1), and rustc's own musl start
# files (they come with rust-std) are left to zig (`-C
# link-self-contained=no`: zig links its bundled musl). The result is the
# same kind of binary; the first build takes about 2 min longer.
# Environment: TRIB_ZIG_VENV (default /tmp/tributary-zig).

# Pinned: the versions the sizes in README.md were measured with.
ZIGBUILD_VERSION=0.24.1
ZIG_VERSION=0.17.1

zigbuild_setup() {
  local target=$1
  local venv=${TRIB_ZIG_VENV:-/tmp/tributary-zig}
  ZIGBUILD_ARGS=()
  if ! rustup target list --installed | grep -qx "$target"; then
    local log
    log=$(mktemp)
    if ! rustup target add "$target" >"$log" 2>&1; then
      echo "== no prebuilt standard library for $target ($(grep -m 1 -o 'status code: [0-9]*' "$log" || echo 'rustup target add failed')): building std from rust-src"
      rustup component add rust-src
      ZIGBUILD_ARGS=(-Z build-std=std,panic_abort)
      local target_env
      target_env=$(echo "$target" | tr 'a-z-' 'A-Z_')
      # Only this target's flags change.
      export "CARGO_TARGET_${target_env}_RUSTFLAGS=-C link-self-contained=no"
      export RUSTC_BOOTSTRAP=1
    fi
    rm -f "$log"
  fi
  if ! cargo zigbuild --help >/dev/null 2>&1; then
    echo "== installing cargo-zigbuild $ZIGBUILD_VERSION"
    cargo install "cargo-zigbuild@$ZIGBUILD_VERSION" --locked
  fi
  if ! "$venv/bin/python" -m ziglang version >/dev/null 2>&1; then
    echo "== installing zig (PyPI ziglang $ZIG_VERSION) into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "ziglang==$ZIG_VERSION"
  fi
  # cargo-zigbuild finds zig through `python3 -m ziglang` when no `zig` is
  # on PATH: put the venv's python first.
  export PATH="$venv/bin:$PATH"
}
