//! Generates bindings to the system UCX found through pkg-config (Debian: `libucx-dev`).
//!
//! Only what the rdma-hint UCX backend calls is bound, so the bindings stay small and a UCX
//! upgrade that changes something unrelated does not break the build.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    let ucx = match pkg_config::Config::new().atleast_version("1.12").probe("ucx") {
        Ok(library) => library,
        Err(err) => panic!(
            "rdma-hint-ucx-sys needs the system UCX headers and libraries (pkg-config `ucx` >= 1.12): \
             on Debian run `apt-get install --no-install-recommends libucx-dev clang libclang-dev`. \
             pkg-config said: {err}"
        ),
    };
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_(init_version|cleanup|config_read|config_release|config_modify|context_query|get_version_string)")
        .allowlist_function("ucp_worker_(create|destroy|get_address|release_address|progress|get_efd|arm|signal|set_am_recv_handler|print_info|query|fence)")
        .allowlist_function("ucp_ep_(create|close_nbx|flush_nbx|rkey_unpack|evaluate_perf|print_info)")
        .allowlist_function("ucp_(mem_map|mem_unmap|mem_query|rkey_pack|rkey_buffer_release|rkey_destroy|rkey_ptr|put_nbx|get_nbx|am_send_nbx|request_check_status|request_free)")
        .allowlist_function("ucs_status_string|ucs_global_opts_set_value|ucs_log_init|ucs_log_cleanup")
        .allowlist_function("open_memstream|fclose")
        .allowlist_type("ucp_.*")
        .allowlist_var("UCP_.*|UCS_.*")
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for path in &ucx.include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    let bindings = builder.generate().expect("bindgen could not generate UCX bindings");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings.write_to_file(out.join("ucx.rs")).expect("write UCX bindings");
}
