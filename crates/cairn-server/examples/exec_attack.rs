//! The exec attack of issue 52, for tests/test_socket_access.py (run as an unprivileged user
//! against root's servers started with `--same-node-other-users true`):
//!
//! 1. this process P connects to a server's Unix socket and checks that a same-node put of its
//!    own memory works;
//! 2. it forks C, which keeps the connection, and P execs `VICTIM SECRET_FILE`, a setuid-root
//!    program that reads a root-only file into memory and prints where (`ADDR LEN`);
//! 3. C names those bytes in same-node puts on P's connection: claiming their right crc32c (an
//!    attacker who guessed right would learn so) and a wrong one (whose error must not tell the
//!    bytes' crc), and reads back what the first put would have stored;
//! 4. C asks the victim whether its copy is intact and prints one verdict line.
//!
//! `exec_attack SOCKET VICTIM SECRET_FILE CRC` with the cluster secret in `CAIRN_SECRET`; `CRC`
//! is the secret's crc32c (what a right guess would claim). Exits 0 when the server read nothing
//! of the victim and wrote nothing into it, 1 otherwise.

use cairn_core::checksum::crc;
use cairn_proto::Response;
use cairn_testing::{get_request, outcome, put_request, same_node, RawConn};
use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, sock, victim, secret_file, want] = &args[..] else {
        eprintln!("usage: exec_attack SOCKET VICTIM SECRET_FILE CRC (CAIRN_SECRET in the environment)");
        std::process::exit(2);
    };
    let want: u32 = want.parse().expect("CRC is a number");
    let mut conn = RawConn::open_unix_path(sock.as_ref(), &std::env::var("CAIRN_SECRET").expect("CAIRN_SECRET")).expect("connect");
    let mine = vec![0x11u8; 4096];
    let own = same_node(put_request("attack", 1, 4096, crc(&mine)), vec![(mine.as_ptr() as u64, 4096)]);
    let r = conn.call(None, &own, &[]).expect("own put");
    assert_eq!(r, Response::Ok, "a same-node put of this process's own memory works before the exec");
    let (to_victim, from_victim) = (pipe(), pipe());
    // SAFETY: single-threaded here (no runtime started); the child uses only its own copies.
    let pid = unsafe { libc::fork() };
    if pid > 0 {
        // P: becomes the setuid program, its stdin and stdout the pipes to C.
        // SAFETY: descriptors this process owns; execv gets NUL-terminated strings and a null end.
        unsafe {
            libc::dup2(to_victim[0], 0);
            libc::dup2(from_victim[1], 1);
            for fd in [to_victim[0], to_victim[1], from_victim[0], from_victim[1]] {
                libc::close(fd);
            }
            let (v, s) = (CString::new(victim.as_str()).unwrap(), CString::new(secret_file.as_str()).unwrap());
            libc::execv(v.as_ptr(), [v.as_ptr(), s.as_ptr(), std::ptr::null()].as_ptr());
            libc::_exit(127);
        }
    }
    // C: still holds P's connection.
    // SAFETY: the ends P uses are closed here; the others are owned by the files made of them.
    unsafe {
        libc::close(to_victim[0]);
        libc::close(from_victim[1]);
    }
    // SAFETY: descriptors just made by pipe(2), owned by nothing else.
    let (mut tell, mut hear) =
        unsafe { (std::fs::File::from_raw_fd(to_victim[1]), BufReader::new(std::fs::File::from_raw_fd(from_victim[0]))) };
    let said = next_line(&mut hear);
    let Some((addr, len)) = said.split_once(' ').and_then(|(a, l)| Some((a.parse::<u64>().ok()?, l.parse::<u64>().ok()?))) else {
        println!("victim did not run: {said}");
        std::process::exit(3);
    };
    let right = outcome(&conn.call(None, &same_node(put_request("attack", 2, len, want), vec![(addr, len)]), &[]));
    let wrong = outcome(&conn.call(None, &same_node(put_request("attack", 3, len, want ^ 1), vec![(addr, len)]), &[]));
    // Whatever the first put stored, had it been taken.
    let got = outcome(&conn.call(None, &get_request("attack", 2, len), &[]));
    writeln!(tell, "done").unwrap();
    let after = next_line(&mut hear);
    let told = |c: u32| wrong.contains(&c.to_string()) || wrong.contains(&format!("{c:#x}"));
    let breached = right == "done" || got == "done" || told(want) || told(want ^ 1) || after != "intact";
    println!(
        "exec attack: right-guess put {right} | wrong-guess put {wrong} | get {got} | victim: {after} | {}",
        if breached { "BREACHED" } else { "safe" }
    );
    std::io::stdout().flush().unwrap();
    // Now the victim may exit (as pid 1 of a pid namespace its exit ends this process too).
    let _ = writeln!(tell, "bye");
    std::process::exit(i32::from(breached));
}

fn pipe() -> [RawFd; 2] {
    let mut fds = [0; 2];
    // SAFETY: a two-descriptor array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    fds
}

fn next_line(r: &mut impl BufRead) -> String {
    let mut s = String::new();
    let _ = r.read_line(&mut s);
    s.trim().to_string()
}
