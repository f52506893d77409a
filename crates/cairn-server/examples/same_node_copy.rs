//! The same-node transfer, measured: how a server on the client's host can move an object's bytes
//! in one copy. Cross-memory attach (what `cairn_server::cma` does: the server copies straight
//! between the client's array and its object buffer) against a shared-memory segment (`memfd` +
//! `mmap`: the writer copies its array into a segment that the server adopts as the object's
//! storage, and a reader copies out of the server's segment), with memcpy between two buffers of
//! one process as the ceiling, all in the same run. The client is a real second process (forked),
//! so the cross-memory copies cross address spaces as they do in service.
//!
//! `cargo run --release -p cairn-server --example same_node_copy [-- MiB...]` prints a table and
//! writes `bench/results/same_node_copy.json`. The numbers that chose the transport are in the
//! comment of `cma.rs`.

use std::time::Instant;

const REPEAT: usize = 7;

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("sizes in MiB")).collect();
    let sizes = if sizes.is_empty() { vec![1, 16, 256] } else { sizes };
    let mut rows = Vec::new();
    println!("| object | memcpy GB/s | CMA put | CMA put + crc32c | memfd put (fresh segment) | memfd put (pooled) | memfd get |");
    println!("|---|---|---|---|---|---|---|");
    for mib in sizes {
        let n = mib << 20;
        let child = Child::spawn(n);
        let src = filled(n);
        let mut dst = filled(n);
        let gbs = |secs: f64| n as f64 / secs / 1e9;
        let memcpy = best(|| dst.copy_from_slice(&src));
        let remote = [(child.addr, n as u64)];
        let peer = cairn_server::cma::Peer::open(child.pid).expect("a pidfd of the child");
        let cma_put = best(|| peer.read(&remote, &mut dst, &mut |_| {}).expect("process_vm_readv"));
        let cma_put_crc = best(|| {
            let mut crc = 0;
            peer.read(&remote, &mut dst, &mut |b| crc = cairn_core::checksum::crc_append(crc, b)).expect("read");
            std::hint::black_box(crc);
        });
        // A segment per object, as a server adopting the writer's segment as storage gets: its
        // pages are faulted in (and zeroed by the kernel) by the writer's copy.
        let memfd_fresh = best(|| {
            let seg = Segment::new(n);
            seg.bytes().copy_from_slice(&src);
        });
        let pooled = Segment::new(n);
        pooled.bytes().fill(1);
        let memfd_pooled = best(|| pooled.bytes().copy_from_slice(&src));
        // (Gets into client memory are gone since issue 52: a server never writes a client.)
        let memfd_get = best(|| dst.copy_from_slice(pooled.bytes()));
        drop(child);
        let row = [memcpy, cma_put, cma_put_crc, memfd_fresh, memfd_pooled, memfd_get].map(gbs);
        let cells: Vec<String> = row[1..].iter().map(|v| format!("{v:.2} ({:.2}×)", v / row[0])).collect();
        println!("| {mib} MiB | {:.2} | {} |", row[0], cells.join(" | "));
        let names = ["memcpy", "cma_put", "cma_put_crc", "memfd_put_fresh", "memfd_put_pooled", "memfd_get"];
        let mut obj = serde_json::Map::new();
        obj.insert("object_mib".into(), mib.into());
        for (k, v) in names.iter().zip(row) {
            obj.insert(format!("{k}_gbps"), serde_json::json!((v * 100.0).round() / 100.0));
        }
        rows.push(serde_json::Value::Object(obj));
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results/same_node_copy.json");
    let doc = serde_json::json!({"bench": "same_node_copy", "repeat": REPEAT, "unit": "GB/s, best of repeat", "rows": rows});
    std::fs::write(&out, serde_json::to_string_pretty(&doc).expect("json") + "\n").expect("writing the results");
    println!("saved {}", out.canonicalize().unwrap_or(out).display());
}

/// The fastest of [`REPEAT`] runs, in seconds.
fn best(mut f: impl FnMut()) -> f64 {
    (0..REPEAT)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn filled(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// A forked process holding `n` bytes at `addr` until dropped.
struct Child {
    pid: i32,
    addr: u64,
    stop: i32,
}

impl Child {
    fn spawn(n: usize) -> Child {
        let (mut up, mut down) = ([0i32; 2], [0i32; 2]);
        // SAFETY: plain pipe/fork/read/write calls on buffers owned here; the child only touches
        // its own copy of the address space and leaves with `_exit`.
        unsafe {
            assert!(libc::pipe(up.as_mut_ptr()) == 0 && libc::pipe(down.as_mut_ptr()) == 0, "pipe");
            let pid = libc::fork();
            assert!(pid >= 0, "fork");
            if pid == 0 {
                // Only the parent may hold the write end, so its close ends the read below.
                libc::close(down[1]);
                libc::close(up[0]);
                let buf = filled(n);
                let addr = buf.as_ptr() as u64;
                libc::write(up[1], (&addr as *const u64).cast(), 8);
                let mut byte = 0u8;
                libc::read(down[0], (&mut byte as *mut u8).cast(), 1);
                drop(buf);
                libc::_exit(0);
            }
            let mut addr = 0u64;
            assert_eq!(libc::read(up[0], (&mut addr as *mut u64).cast(), 8), 8, "the child's address");
            libc::close(up[0]);
            libc::close(up[1]);
            libc::close(down[0]);
            Child { pid, addr, stop: down[1] }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // SAFETY: closing our end of the pipe ends the child's read; then it is reaped.
        unsafe {
            libc::close(self.stop);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// A `memfd` segment of `n` bytes mapped shared, as a writer and a server would both map it.
struct Segment {
    fd: i32,
    ptr: *mut u8,
    n: usize,
}

impl Segment {
    fn new(n: usize) -> Segment {
        // SAFETY: a new anonymous file sized to `n` and mapped whole; checked before use.
        unsafe {
            let fd = libc::memfd_create(c"cairn-bench".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0 && libc::ftruncate(fd, n as libc::off_t) == 0, "memfd");
            let ptr = libc::mmap(std::ptr::null_mut(), n, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            assert!(ptr != libc::MAP_FAILED, "mmap");
            Segment { fd, ptr: ptr.cast(), n }
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: the mapping is `n` bytes, alive as long as `self`, and used by one caller at a time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.n) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmaps and closes what `new` made.
        unsafe {
            libc::munmap(self.ptr.cast(), self.n);
            libc::close(self.fd);
        }
    }
}
