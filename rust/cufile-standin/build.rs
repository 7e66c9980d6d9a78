//! Gives the stand-in the SONAME `libcufile.so`, so that once a process has loaded it by
//! path, cudarc's own by-name `dlopen("libcufile.so")` resolves to the loaded stand-in.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcufile.so");
    println!("cargo:rerun-if-changed=build.rs");
}
