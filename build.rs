//! Compiles the C++ shim in `csrc/` against the libtorch that torch-sys found, and links the
//! CUDA parts of libtorch. See the README's "Using the crate from another crate" for what a
//! downstream binary's own build needs.
use std::env;
use std::path::{Path, PathBuf};

fn env_var(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var(name).ok().filter(|v| !v.is_empty())
}

/// CUDA include directories, looked for in order; returns the first that has the runtime headers.
fn find_cuda_include(torch_root: &Path) -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    let mut candidates = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(dir) = env_var(var) {
            candidates.push((format!("${var}/include"), PathBuf::from(dir).join("include")));
        }
    }
    candidates.push(("/usr/local/cuda/include".into(), PathBuf::from("/usr/local/cuda/include")));
    if let Some(site) = torch_root.parent() {
        candidates.push(("nvidia/cu13/include beside torch".into(), site.join("nvidia").join("cu13").join("include")));
    }
    for (label, dir) in candidates {
        if dir.join("cuda_runtime_api.h").exists() && dir.join("crt").join("host_config.h").exists() {
            return Ok(dir);
        }
        looked.push(format!("{label} ({})", dir.display()));
    }
    Err(looked.join(", "))
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/tcg.cpp");
    println!("cargo:rerun-if-changed=csrc/tcg.h");
    println!("cargo:rerun-if-changed=csrc/cudart.cpp");

    // torch-sys (links = "tch") exports the libtorch lib dir it linked against.
    let lib_dir = env_var("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "tch-cuda-graphs: torch-sys did not report a libtorch lib dir (DEP_TCH_LIBTORCH_LIB); \
             run `bash scripts/setup.sh` or set LIBTORCH"
        )
    });
    let lib_dir = lib_dir.canonicalize().unwrap_or(lib_dir);
    let torch_root = lib_dir.parent().expect("libtorch lib dir has a parent").to_path_buf();
    let include = torch_root.join("include");
    let cxx11_abi = env_var("LIBTORCH_CXX11_ABI").unwrap_or_else(|| "1".to_owned());
    let with_cuda = lib_dir.join("libtorch_cuda.so").exists();

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        // Nothing of the shim is exported from a binary (see csrc/cudart.cpp).
        .flag("-fvisibility=hidden")
        .file("csrc/tcg.cpp")
        .file("csrc/cudart.cpp");
    if with_cuda {
        match find_cuda_include(&torch_root) {
            Ok(dir) => {
                build.include(&dir);
                // The CCCL headers (nv/target) live in a subfolder of the pip CUDA 13 layout.
                if dir.join("cccl").exists() {
                    build.include(dir.join("cccl"));
                }
            }
            Err(looked) => panic!(
                "tch-cuda-graphs: libtorch at {} has CUDA, but no CUDA headers were found. \
                 Looked in: {looked}. Set CUDA_HOME, or install the pip package \
                 cuda-toolkit[nvcc,cccl]==13.0.2 (scripts/setup.sh does).",
                torch_root.display()
            ),
        }
    } else {
        println!(
            "cargo:warning=tch-cuda-graphs: libtorch at {} has no CUDA; every GPU entry point will \
             return Error::NoCuda",
            torch_root.display()
        );
        build.define("TCG_NO_CUDA", None);
    }
    build.compile("tch_cuda_graphs_shim");

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    if with_cuda {
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    // This crate's own tests, examples and benches find libtorch without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    println!("cargo:lib_dir={}", lib_dir.display());
}
