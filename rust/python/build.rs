//! Records the git commit the extension is built from, for `kvikpy.__git_commit__` (as
//! kvikio's `__git_commit__`): `KVIKPY_GIT_COMMIT` at compile time, empty where the source
//! is not a git checkout (an sdist) or git is missing.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    // Only a checkout of kvikpy itself: an sdist unpacked inside some other repository
    // must not take that repository's commit.
    let ours = git(&["ls-files", "--full-name", "build.rs"]).is_some();
    let commit = if ours {
        git(&["rev-parse", "HEAD"]).unwrap_or_default()
    } else {
        String::new()
    };
    println!("cargo:rustc-env=KVIKPY_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    if commit.is_empty() {
        return;
    }
    // Build again when HEAD moves: a commit, a checkout, a fetch that repacks refs. Paths
    // come from git itself, which knows where a worktree keeps them.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
