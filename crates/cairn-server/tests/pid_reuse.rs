//! Issue 40, defect 1: a same-node copy never touches a process other than the one that opened
//! the connection, even after that one exits and an unrelated process takes its pid.
//!
//! Real processes in a new pid namespace (root only; skipped with a message otherwise), where
//! `ns_last_pid` hands the gone client's pid to the victim at once instead of after ~30k forks:
//! - the orchestrator (pid 1 of the namespace) runs a server;
//! - the attacker connects, checks that same-node copies work for it, forks a child that keeps
//!   the connection, and exits;
//! - the victim takes the attacker's pid and holds a secret buffer;
//! - the child names the victim's buffer in a put.
//!
//! Before the fix the server copied by pid: the put's `corrupt` error carried the crc of the
//! victim's bytes (and a probe and a get `into`, both removed since issue 52, answered a guess of
//! them and overwrote them). Now the put fails and the victim's bytes are untouched.

use cairn_core::checksum::crc;
use cairn_proto::Response;
use cairn_server::Limits;
use cairn_testing::{get_request, outcome, put_request, same_node, RawConn, TestCluster};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const ROLE: &str = "CAIRN_PID_REUSE_ROLE";
const LEN: usize = 4096;

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("orchestrator") => orchestrator(),
        Ok("attacker") => attacker(),
        Ok("victim") => victim(),
        Ok("stranger") => stranger(),
        _ => outside(),
    }
}

/// The test as `cargo test` runs it: the rest in a new pid (and mount) namespace, within a minute.
fn outside() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("pid_reuse: skipped, a new pid namespace needs root (CI runs as root)");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    // Where the sandbox forbids new namespaces even to root, say so and skip.
    let probe = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => return println!("pid_reuse: skipped, no new pid namespace here: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => return println!("pid_reuse: skipped, unshare (util-linux) is missing: {e}"),
    }
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(&exe)
        .env(ROLE, "orchestrator")
        .spawn()
        .expect("unshare (util-linux)");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait()));
    let status = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(s) => s.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on the child we spawned and have not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("pid_reuse: the namespace did not finish within 60 s");
        }
    };
    assert!(status.success(), "pid_reuse failed: {status}");
    println!("pid_reuse: a copy never touched the process that took a gone client's pid");
}

fn role(name: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.env(ROLE, name).stdin(Stdio::piped()).stdout(Stdio::piped());
    c
}

fn line(r: &mut impl BufRead) -> String {
    let mut s = String::new();
    r.read_line(&mut s).unwrap();
    s.trim().to_string()
}

fn orchestrator() {
    assert_eq!(std::process::id(), 1, "runs as pid 1 of its namespace");
    let dir = tempfile::tempdir().unwrap();
    let cluster = TestCluster::start(dir.path(), 1, 0, 64 << 20, Limits::default()).unwrap();
    let mut attacker = role("attacker").env("CAIRN_SOCK", cluster.unix_path(0)).env("CAIRN_SECRET", cluster.secret()).spawn().unwrap();
    let gone = attacker.id() as i32;
    let mut to_child = attacker.stdin.take().unwrap();
    let mut from_child = BufReader::new(attacker.stdout.take().unwrap());
    assert_eq!(line(&mut from_child), "copies work", "same-node copies must work for the attacker itself");
    // The attacker exits after forking; reaped here, its pid is free.
    assert!(attacker.wait().unwrap().success());
    let mut victim = None;
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (gone - 1).to_string()).unwrap();
        let v = role("victim").spawn().unwrap();
        if v.id() as i32 == gone {
            victim = Some(v);
            break;
        }
        let mut v = v;
        let _ = v.kill();
        let _ = v.wait();
    }
    let mut victim = victim.expect("the victim took the gone attacker's pid");
    let mut from_victim = BufReader::new(victim.stdout.take().unwrap());
    let buffer = line(&mut from_victim);
    writeln!(to_child, "{buffer}").unwrap();
    let verdict = line(&mut from_child);
    let mut to_victim = victim.stdin.take().unwrap();
    writeln!(to_victim, "report").unwrap();
    let after = line(&mut from_victim);
    victim.wait().unwrap();
    let crc = buffer.split(' ').nth(2).unwrap().to_string();
    println!("victim {buffer}; child: {verdict}; victim after: {after}");
    assert_eq!(after, crc, "the victim's buffer was written through the gone client's connection");
    assert!(verdict.starts_with("put=refused"), "{verdict}");
    let hex = format!("{:#x}", crc.parse::<u32>().unwrap());
    assert!(!verdict.contains(&crc) && !verdict.contains(&hex), "an error told the victim's crc: {verdict}");

    // A client of another user gets no same-node copies (this server runs as root, whom the
    // kernel would let copy).
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let sock = cluster.unix_path(0);
    for p in [dir.path(), sock.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let out = role("stranger").env("CAIRN_SOCK", &sock).env("CAIRN_SECRET", cluster.secret()).uid(65534).gid(65534).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    println!("stranger: {said}");
    assert!(out.status.success() && said.contains("of user 65534"), "{said}");
}

/// A client of another user names its own memory in a put.
fn stranger() {
    let sock = PathBuf::from(std::env::var("CAIRN_SOCK").unwrap());
    let mut conn = RawConn::open_unix_path(&sock, &std::env::var("CAIRN_SECRET").unwrap()).unwrap();
    let mine = vec![0xEEu8; LEN];
    let put = same_node(put_request("s", 1, LEN as u64, crc(&mine)), vec![(mine.as_ptr() as u64, LEN as u64)]);
    println!("{:?}", conn.call(None, &put, &[]).unwrap());
}

fn attacker() {
    let sock = PathBuf::from(std::env::var("CAIRN_SOCK").unwrap());
    let mut conn = RawConn::open_unix_path(&sock, &std::env::var("CAIRN_SECRET").unwrap()).unwrap();
    let mine = vec![0xEEu8; LEN];
    let put = |id| put_request("d", id, LEN as u64, crc(&mine));
    assert_eq!(conn.call(None, &put(1), &[&mine]).unwrap(), Response::Ok);
    // Same-node copies work for the process that connected: a put of its own memory.
    let r = conn.call(None, &same_node(put(3), vec![(mine.as_ptr() as u64, LEN as u64)]), &[]).unwrap();
    assert_eq!(r, Response::Ok, "a same-node put of the attacker's own buffer");
    // SAFETY: this process is single-threaded (no test harness); the child only uses its own
    // copies of memory and exits.
    let pid = unsafe { libc::fork() };
    if pid != 0 {
        println!("copies work");
        std::io::stdout().flush().unwrap();
        // Exits at once: the child keeps the connection.
        unsafe { libc::_exit(0) };
    }
    let stdin = std::io::stdin();
    let spec = line(&mut stdin.lock());
    let parts: Vec<u64> = spec.split(' ').map(|p| p.parse().unwrap()).collect();
    let (addr, len) = (parts[0], parts[1]);
    let put = outcome(&conn.call(None, &same_node(put_request("d", 2, LEN as u64, 0), vec![(addr, len)]), &[]));
    // A get answers with a payload to this connection: nothing is written anywhere else.
    let got = outcome(&conn.call(None, &get_request("d", 1, LEN as u64), &[]));
    let word = |s: &str| if s.starts_with("refused") { "refused" } else { "DONE" }.to_string();
    println!("put={} get={} | {put} | {got}", word(&put), word(&got));
    std::io::stdout().flush().unwrap();
}

fn victim() {
    let secret = vec![0x5Au8; LEN];
    println!("{} {LEN} {}", secret.as_ptr() as u64, cairn_core::checksum::crc(&secret));
    std::io::stdout().flush().unwrap();
    let _ = line(&mut std::io::stdin().lock());
    println!("{}", cairn_core::checksum::crc(&secret));
}
