//! Compiles the C++ shim in `csrc/` against the libtorch that torch-sys found, and links the
//! CUDA parts of libtorch. See `docs/building.md` ("Using the crate from another crate") for what a
//! downstream binary's own build needs.
//!
//! Environment (each also read by torch-sys, so both sides agree):
//! - `LIBTORCH_INCLUDE`: the directory holding libtorch's `include/` (default: beside `lib/`).
//! - `LIBTORCH_USE_PYTORCH`: take headers and the C++ ABI from the Python torch package.
//! - `LIBTORCH_CXX11_ABI`: `0` or `1` (default `1`) when not using PyTorch's.
//!
//! And this crate's own:
//! - `TCH_CUDA_GRAPHS_NO_CUDA=1`: build the shim without CUDA even when libtorch has it (every
//!   GPU entry point then returns `Error::NoCuda`); CI builds and tests this variant.
//! - `NVCC`: the nvcc that compiles the crate's own kernels (`csrc/cuda/*_kernels.cu`;
//!   default: the venv's, from pip's `nvidia/cu13/bin` beside torch, then `$CUDA_HOME/bin`,
//!   `/usr/local/cuda/bin`). Without one, the optimizers run PyTorch's fused kernels and the
//!   fused layers ATen's operators.
//! - `TCH_CUDA_GRAPHS_CUDA_ARCHS`: the GPU architectures of those fat binaries (default `80;90;100`,
//!   each as SASS, plus PTX of the last for newer GPUs).
//! - `TCH_CUDA_GRAPHS_NO_OWN_KERNELS=1`: do not build them.
//! - `CUTLASS_DIR`: the CUTLASS checkout or package whose `include/` (and `tools/util/include/`)
//!   the GEMMs with GELU or SwiGLU's backward in their epilogues build against
//!   (`csrc/cuda/gelu_gemm.cu`, `csrc/cuda/swiglu_gemm.cu`, sm_90 only; default: pip's
//!   `nvidia-cutlass` beside torch, `cutlass_library/source`). Without it, or without 90 among the
//!   architectures, the MLPs with exact GELU or SwiGLU run their GEMMs and activation kernels
//!   apart.
//! - the `doc-only` feature, or `DOCS_RS`: compile nothing (docs.rs has no libtorch).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

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
        // pip's CUDA packages beside torch: nvidia/cu13/include (CUDA 13), nvidia/cuda_runtime/include (12)
        for sub in ["cu13", "cuda_runtime"] {
            candidates
                .push((format!("nvidia/{sub}/include beside torch"), site.join("nvidia").join(sub).join("include")));
        }
    }
    for (label, dir) in candidates {
        if dir.join("cuda_runtime_api.h").exists() && dir.join("crt").join("host_config.h").exists() {
            return Ok(dir);
        }
        looked.push(format!("{label} ({})", dir.display()));
    }
    Err(looked.join(", "))
}

/// The nvcc to build the own kernels with, if any.
fn find_nvcc(torch_root: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = env_var("NVCC").map(PathBuf::from).into_iter().collect();
    if let Some(site) = torch_root.parent() {
        candidates.push(site.join("nvidia").join("cu13").join("bin").join("nvcc"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(dir) = env_var(var) {
            candidates.push(PathBuf::from(dir).join("bin").join("nvcc"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    candidates.into_iter().find(|p| p.is_file())
}

/// The crate's own kernels: each `csrc/cuda/NAME.cu` becomes a fat binary embedded as
/// `tcg_NAME_fatbin` (loaded by `csrc/cuda/own_kernels.cpp`).
const OWN_KERNELS: [&str; 8] = [
    "optim_kernels",
    "norm_kernels",
    "loss_kernels",
    "rotary_kernels",
    "swiglu_kernels",
    "gelu_kernels",
    "embedding_kernels",
    "linear_kernels",
];

/// nvcc and the architectures to build for (`TCH_CUDA_GRAPHS_CUDA_ARCHS`), unless
/// `TCH_CUDA_GRAPHS_NO_OWN_KERNELS` is set or no nvcc is found (Err: why).
fn nvcc_and_archs(torch_root: &Path) -> Result<(PathBuf, Vec<String>), String> {
    if env_var("TCH_CUDA_GRAPHS_NO_OWN_KERNELS").is_some_and(|v| v != "0") {
        return Err("TCH_CUDA_GRAPHS_NO_OWN_KERNELS is set".into());
    }
    let nvcc = find_nvcc(torch_root).ok_or("no nvcc found (set NVCC, or run scripts/setup.sh)")?;
    let archs = env_var("TCH_CUDA_GRAPHS_CUDA_ARCHS").unwrap_or_else(|| "80;90;100".into());
    Ok((nvcc, archs.split([';', ',', ' ']).filter(|a| !a.is_empty()).map(str::to_owned).collect()))
}

/// `-I` for the CUDA headers (and the CCCL ones pip's CUDA 13 layout keeps in a subfolder).
fn add_cuda_includes(cmd: &mut Command, cuda_include: &Path) {
    cmd.arg("-I").arg(cuda_include);
    if cuda_include.join("cccl").exists() {
        cmd.arg("-I").arg(cuda_include.join("cccl"));
    }
}

/// Runs nvcc's `cmd` on `file`; Err: its first error lines (its first lines where none says so:
/// CUTLASS's headers print pages of warnings before one).
fn run_nvcc(mut cmd: Command, nvcc: &Path, file: &str) -> Result<(), String> {
    let output = cmd.output().map_err(|e| format!("{} did not run: {e}", nvcc.display()))?;
    if output.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&output.stderr);
    let mut first: Vec<&str> = err.lines().filter(|l| l.contains("error") || l.contains("fatal")).take(6).collect();
    if first.is_empty() {
        first = err.lines().filter(|l| !l.trim().is_empty()).take(6).collect();
    }
    Err(format!("{} failed on {file}: {}", nvcc.display(), first.join(" | ")))
}

/// Compiles the [`OWN_KERNELS`] into fat binaries and writes a C++ file that embeds them. Err: why
/// not (the optimizers then run PyTorch's fused kernels and the fused layers ATen's operators;
/// the crate says so at run time).
fn build_own_kernels(
    torch_root: &Path,
    includes: &[PathBuf],
    cuda_include: &Path,
    cxx11_abi: &str,
) -> Result<PathBuf, String> {
    let (nvcc, archs) = nvcc_and_archs(torch_root)?;
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let mut asm = String::from("// Generated by build.rs: the own kernels' fat binaries, embedded.\n");
    for name in OWN_KERNELS {
        let fatbin = out.join(format!("{name}.fatbin"));
        let mut cmd = Command::new(&nvcc);
        cmd.args(["--fatbin", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "--threads", "0"])
            .args(["-Xfatbin", "-compress-all", "-DGLOG_USE_GLOG_EXPORT"])
            .arg(format!("-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"));
        for (k, arch) in archs.iter().enumerate() {
            let code = if k + 1 == archs.len() { format!("[sm_{arch},compute_{arch}]") } else { format!("sm_{arch}") };
            cmd.arg("-gencode").arg(format!("arch=compute_{arch},code={code}"));
        }
        for dir in includes {
            cmd.arg("-I").arg(dir);
        }
        add_cuda_includes(&mut cmd, cuda_include);
        cmd.arg(format!("csrc/cuda/{name}.cu")).arg("-o").arg(&fatbin);
        run_nvcc(cmd, &nvcc, &format!("{name}.cu"))?;
        let path = fatbin.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
        asm.push_str(&format!(
            "__asm__(\".section .rodata\\n.balign 64\\n\
             .global tcg_{name}_fatbin\\n.hidden tcg_{name}_fatbin\\ntcg_{name}_fatbin:\\n\
             .incbin \\\"{path}\\\"\\n\
             .byte 0\\n.previous\\n\");\n"
        ));
    }
    let embed = out.join("own_kernels_fatbin.cpp");
    std::fs::write(&embed, asm).map_err(|e| format!("writing {}: {e}", embed.display()))?;
    Ok(embed)
}

/// The CUTLASS source tree (holding `include/cutlass/cutlass.h`): `$CUTLASS_DIR`, or pip's
/// `nvidia-cutlass` beside torch.
fn find_cutlass(torch_root: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = env_var("CUTLASS_DIR").map(PathBuf::from).into_iter().collect();
    if let Some(site) = torch_root.parent() {
        candidates.push(site.join("cutlass_library").join("source"));
    }
    candidates.into_iter().find(|d| d.join("include").join("cutlass").join("cutlass.h").exists())
}

/// Compiles the CUTLASS GEMMs (`csrc/cuda/gelu_gemm.cu`, `csrc/cuda/swiglu_gemm.cu`,
/// `csrc/cuda/wgrad_gemm.cu`, `csrc/cuda/ce_head_gemm.cu`, `csrc/cuda/rotary_gemm.cu`:
/// CUTLASS's kernels and the host code that launches them) into objects for the shim, for
/// sm_90a. Err: why not (the MLPs then run their GEMMs and activation kernels apart, every weight
/// gradient runs in cuBLASLt, the head's loss over its logits and rotary embeddings after the
/// projection's GEMM).
fn build_cutlass_gemms(torch_root: &Path, cuda_include: &Path) -> Result<Vec<PathBuf>, String> {
    let (nvcc, archs) = nvcc_and_archs(torch_root)?;
    if !archs.iter().any(|a| a == "90") {
        return Err("90 is not among TCH_CUDA_GRAPHS_CUDA_ARCHS".into());
    }
    let cutlass =
        find_cutlass(torch_root).ok_or("no CUTLASS headers found (set CUTLASS_DIR, or run scripts/setup.sh)")?;
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let mut objects = Vec::new();
    for name in ["gelu_gemm", "swiglu_gemm", "wgrad_gemm", "ce_head_gemm", "rotary_gemm"] {
        let object = out.join(format!("{name}.o"));
        let mut cmd = Command::new(&nvcc);
        cmd.args(["-c", "-O3", "-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr"])
            .args(["-gencode", "arch=compute_90a,code=sm_90a", "-Xcompiler", "-fPIC,-fvisibility=hidden"])
            .arg("-I")
            .arg(cutlass.join("include"))
            .arg("-I")
            .arg(cutlass.join("tools").join("util").join("include"));
        add_cuda_includes(&mut cmd, cuda_include);
        cmd.arg(format!("csrc/cuda/{name}.cu")).arg("-o").arg(&object);
        run_nvcc(cmd, &nvcc, &format!("{name}.cu"))?;
        objects.push(object);
    }
    Ok(objects)
}

/// The directory holding `nccl.h`: `$NCCL_INCLUDE_DIR`, or pip's `nvidia/nccl/include` beside
/// torch (the wheel libtorch's own NCCL comes from).
fn find_nccl_include(torch_root: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = env_var("NCCL_INCLUDE_DIR").map(PathBuf::from).into_iter().collect();
    if let Some(site) = torch_root.parent() {
        candidates.push(site.join("nvidia").join("nccl").join("include"));
    }
    candidates.push(PathBuf::from("/usr/include"));
    candidates.into_iter().find(|d| d.join("nccl.h").exists())
}

/// libtorch's include directories and C++ ABI, found the way torch-sys finds them.
fn torch_headers_and_abi(torch_root: &Path) -> (Vec<PathBuf>, String) {
    if env_var("LIBTORCH_USE_PYTORCH").is_some() {
        let python = if env::var_os("VIRTUAL_ENV").is_some() { "python" } else { "python3" };
        let script = "import torch\nfrom torch.utils import cpp_extension\n\
                      print('ABI', int(torch._C._GLIBCXX_USE_CXX11_ABI))\n\
                      for p in cpp_extension.include_paths(): print('INCLUDE', p)\n";
        let out = Command::new(python)
            .args(["-c", script])
            .output()
            .unwrap_or_else(|e| panic!("tch-cuda-graphs: LIBTORCH_USE_PYTORCH is set but {python} failed: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let abi = text.lines().find_map(|l| l.strip_prefix("ABI ")).map(str::to_owned);
        let includes: Vec<PathBuf> =
            text.lines().filter_map(|l| l.strip_prefix("INCLUDE ")).map(PathBuf::from).collect();
        let abi = abi.unwrap_or_else(|| panic!("tch-cuda-graphs: {python} printed no C++ ABI: {text}"));
        return (includes, abi);
    }
    let root = env_var("LIBTORCH_INCLUDE").map(PathBuf::from).unwrap_or_else(|| torch_root.to_path_buf());
    let include = root.join("include");
    let abi = env_var("LIBTORCH_CXX11_ABI").unwrap_or_else(|| "1".to_owned());
    (vec![include.clone(), include.join("torch/csrc/api/include")], abi)
}

/// The shim's files that every build compiles.
const SHIM_FILES: [&str; 20] = [
    "csrc/amp.cpp",
    "csrc/autograd.cpp",
    "csrc/error.cpp",
    "csrc/feed.cpp",
    "csrc/kernels.cpp",
    "csrc/gemm.cpp",
    "csrc/optim.cpp",
    "csrc/norm.cpp",
    "csrc/shadow.cpp",
    "csrc/linear.cpp",
    "csrc/loss.cpp",
    "csrc/rotary.cpp",
    "csrc/swiglu.cpp",
    "csrc/embedding.cpp",
    "csrc/gelu.cpp",
    "csrc/mlp.cpp",
    "csrc/profiler.cpp",
    "csrc/watch.cpp",
    "csrc/layout.cpp",
    "csrc/bucket_plan.cpp",
];

/// The shim's files that a libtorch with CUDA adds.
const SHIM_CUDA_FILES: [&str; 18] = [
    "csrc/cuda/device.cpp",
    "csrc/cuda/conditional.cpp",
    "csrc/cuda/graph.cpp",
    "csrc/cuda/graphed.cpp",
    "csrc/cuda/memory.cpp",
    "csrc/cuda/cudart.cpp",
    "csrc/cuda/optim_own.cpp",
    "csrc/cuda/own_kernels.cpp",
    "csrc/cuda/norm_own.cpp",
    "csrc/cuda/lt_matmul.cpp",
    "csrc/cuda/linear_own.cpp",
    "csrc/cuda/mlp_own.cpp",
    "csrc/cuda/cublaslt.cpp",
    "csrc/cuda/loss_own.cpp",
    "csrc/cuda/rotary_own.cpp",
    "csrc/cuda/swiglu_own.cpp",
    "csrc/cuda/embedding_own.cpp",
    "csrc/cuda/gelu_own.cpp",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc");
    if env::var_os("CARGO_FEATURE_DOC_ONLY").is_some() || env_var("DOCS_RS").is_some() {
        return; // docs only: no libtorch, nothing to compile or link
    }

    // torch-sys (links = "tch") exports the libtorch lib dir it linked against.
    let lib_dir = env_var("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "tch-cuda-graphs: torch-sys did not report a libtorch lib dir (DEP_TCH_LIBTORCH_LIB); \
             run `bash scripts/setup.sh` or set LIBTORCH"
        )
    });
    let lib_dir = lib_dir.canonicalize().unwrap_or(lib_dir);
    let torch_root = lib_dir.parent().expect("libtorch lib dir has a parent").to_path_buf();
    let (includes, cxx11_abi) = torch_headers_and_abi(&torch_root);
    let libtorch_has_cuda = lib_dir.join("libtorch_cuda.so").exists();
    let forced_off = env_var("TCH_CUDA_GRAPHS_NO_CUDA").is_some_and(|v| v != "0");
    let with_cuda = libtorch_has_cuda && !forced_off;
    // For this package's tests: what the build found, to check the shim against.
    println!("cargo:rustc-env=TCG_LIBTORCH_HAS_CUDA={}", u8::from(libtorch_has_cuda));

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .includes(&includes)
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        // Nothing of the shim is exported from a binary (see csrc/cuda/cudart.cpp).
        .flag("-fvisibility=hidden")
        .files(SHIM_FILES);
    if with_cuda {
        add_cuda(&mut build, &torch_root, &includes, &cxx11_abi);
    } else {
        let why = if forced_off { "TCH_CUDA_GRAPHS_NO_CUDA is set" } else { "libtorch has no CUDA" };
        println!(
            "cargo:warning=tch-cuda-graphs: built without CUDA ({why}, libtorch at {}); every GPU \
             entry point will return Error::NoCuda",
            torch_root.display()
        );
        build.files(["csrc/no_cuda.cpp", "csrc/no_dist.cpp"]);
    }
    build.compile("tch_cuda_graphs_shim");
    link(&lib_dir, with_cuda);
}

/// The CUDA half of the shim: its files, the crate's own kernels (when nvcc builds them), and
/// the process groups (when NCCL's header is there).
fn add_cuda(build: &mut cc::Build, torch_root: &Path, includes: &[PathBuf], cxx11_abi: &str) {
    let cuda_include = match find_cuda_include(torch_root) {
        Ok(dir) => dir,
        Err(looked) => panic!(
            "tch-cuda-graphs: libtorch at {} has CUDA, but no CUDA headers were found. \
             Looked in: {looked}. Set CUDA_HOME, or install the pip package \
             cuda-toolkit[nvcc,cccl]==13.0.2 (scripts/setup.sh does).",
            torch_root.display()
        ),
    };
    build.include(&cuda_include);
    // The CCCL headers (nv/target) live in a subfolder of the pip CUDA 13 layout.
    if cuda_include.join("cccl").exists() {
        build.include(cuda_include.join("cccl"));
    }
    build.files(SHIM_CUDA_FILES);
    // The crate's own kernels; without them the optimizers run PyTorch's, the fused layers ATen's.
    match build_own_kernels(torch_root, includes, &cuda_include, cxx11_abi) {
        Ok(embed) => {
            build.file(embed).define("TCG_OWN_KERNELS", None);
        }
        Err(why) => {
            println!("cargo:warning=tch-cuda-graphs: own kernels not built ({why}); the optimizers will run PyTorch's fused kernels, the fused layers ATen's operators");
            build.define("TCG_OWN_KERNELS_MISSING", Some(format!("{why:?}").as_str()));
        }
    }
    // the GEMMs with GELU or SwiGLU's backward in their epilogues and the large weight gradients'
    // GEMM, where CUTLASS is there
    match build_cutlass_gemms(torch_root, &cuda_include) {
        Ok(objects) => {
            build.objects(objects).define("TCG_CUTLASS_GEMMS", None);
        }
        Err(why) => {
            println!("cargo:warning=tch-cuda-graphs: CUTLASS's GEMMs not built ({why}); the MLPs with exact GELU or SwiGLU run their GEMMs and activation kernels apart, every weight gradient in cuBLASLt");
        }
    }
    // process groups over libtorch's c10d and NCCL, when NCCL's header is there
    match find_nccl_include(torch_root) {
        Some(dir) => {
            build
                .include(dir)
                .define("USE_C10D_NCCL", None)
                .files(["csrc/cuda/dist.cpp", "csrc/cuda/grad_buckets.cpp"]);
        }
        None => {
            println!("cargo:warning=tch-cuda-graphs: nccl.h not found (set NCCL_INCLUDE_DIR): no process groups");
            build.file("csrc/no_dist.cpp");
        }
    }
}

/// What the binaries link: libtorch's libraries, found without LD_LIBRARY_PATH.
fn link(lib_dir: &Path, with_cuda: bool) {
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    if with_cuda {
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
        // A program that calls nothing of this crate (examples/from_tch/plain.rs: tch alone)
        // would lose libtorch_cuda to the linker's --as-needed, and tch would then see no CUDA
        // (`Device::cuda_if_available()` answers Cpu). The examples keep it, as a tch user does
        // with `-Clink-arg=-Wl,--no-as-needed`; a binary that uses the crate keeps it anyway.
        println!("cargo:rustc-link-arg-examples=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    // This crate's own tests, examples and benches find libtorch without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    println!("cargo:lib_dir={}", lib_dir.display());
}
