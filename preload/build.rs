//! Links GCC's unwinder statically (`libgcc_eh.a`, the archive `-static-libgcc` uses)
//! where the C compiler has it, so that `libscalemem.so` does not load `libgcc_s.so.1`
//! into every process it is preloaded into. Rust's standard library needs an unwinder
//! (for backtraces; this library aborts on panic), and on `*-linux-gnu` it asks for
//! the shared one. Loading it cost every process about 110 µs on our VM, most of it
//! the CPUID instructions of its `__cpu_indicator_init` constructor, each of which
//! traps to the hypervisor (BENCHMARKS.md, "Process start-up"). The archive is linked
//! whole and before the standard library, which then finds every `_Unwind_*` symbol
//! here; the linker's `--as-needed` drops `libgcc_s`. The symbols stay local (a cdylib
//! exports only its `#[no_mangle]` functions), so a C++ program's exceptions still go
//! through its own `libgcc_s`. Without the archive the build falls back to `libgcc_s`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target_env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" || target_env != "gnu" {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let Ok(out) = Command::new(&cc).arg("-print-file-name=libgcc_eh.a").output() else { return };
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let path = Path::new(&path);
    // `-print-file-name` echoes the bare name when the compiler has no such file.
    if !out.status.success() || !path.is_absolute() || !path.exists() {
        println!("cargo:warning=libgcc_eh.a not found through `{cc}`: libscalemem.so will load libgcc_s.so.1");
        return;
    }
    if let Some(dir) = path.parent() {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static:+whole-archive=gcc_eh");
    }
}
