//! Issue 40, item 7: the C API fed random values in every argument it checks (extents, offsets,
//! counts, ranks, step numbers, dtypes, names that are not UTF-8, NULL pointers) answers with a
//! documented status and a message, never `CAIRN_ERR_INTERNAL` (a caught panic) and never a crash.
//! Buffers are always as large as the contract says (the C API cannot check a caller's buffer).

use cairn::*;
use proptest::prelude::*;
use std::ffi::{c_char, CString};
use std::ptr::{null, null_mut};

fn config(dir: &std::path::Path) -> CString {
    let path = dir.join("cairn.toml");
    std::fs::write(&path, format!("engine = \"file\"\n[file]\npath = \"{}\"\n", dir.display())).unwrap();
    CString::new(path.to_str().unwrap()).unwrap()
}

fn documented(s: Status) -> bool {
    s != Status::CairnErrInternal
}

fn last() -> String {
    // SAFETY: the library returns a NUL-terminated string it owns.
    unsafe { std::ffi::CStr::from_ptr(cairn_last_error()) }.to_string_lossy().into_owned()
}

/// Extents: small, zero, huge, at the edges of u64.
fn extent() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..6, Just(u64::MAX), Just(1 << 40), Just(u64::MAX / 2 + 1), any::<u64>()]
}

fn word() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"f8".to_vec()),
        Just(b"i4".to_vec()),
        Just(b"x".to_vec()),
        Just(vec![0xff, 0xfe]),
        Just(Vec::new()),
        proptest::collection::vec(1u8..=255, 0..12)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_arguments_get_documented_statuses(
        rank in prop_oneof![-2i32..3, Just(i32::MAX), Just(i32::MIN)],
        nranks in prop_oneof![-1i32..3, Just(i32::MAX)],
        ndim in -2i32..12,
        shape in proptest::collection::vec(extent(), 12),
        offset in proptest::collection::vec(extent(), 12),
        count in proptest::collection::vec(extent(), 12),
        step in prop_oneof![0u64..4, Just(u64::MAX)],
        dtype in word(),
        name in word(),
        mode in prop_oneof![Just("w"), Just("a"), Just("r"), Just("?")],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let name = CString::new(name.clone()).unwrap_or_else(|_| CString::new("d").unwrap());
        let dtype = CString::new(dtype).unwrap_or_else(|_| CString::new("f8").unwrap());
        let mode = CString::new(mode).unwrap();
        let var = CString::new("v").unwrap();
        let mut f: *mut CairnFile = null_mut();
        // SAFETY: every pointer is valid or NULL as each function's contract allows; every
        // buffer passed is as large as its call says.
        unsafe {
            let s = cairn_open(name.as_ptr(), mode.as_ptr(), cfg.as_ptr(), rank, nranks, &mut f);
            prop_assert!(documented(s), "open: {s:?} {}", last());
            if s != Status::CairnOk {
                prop_assert!(!last().is_empty());
                return Ok(());
            }
            let s = cairn_define(f, var.as_ptr(), dtype.as_ptr(), ndim, shape.as_ptr());
            prop_assert!(documented(s), "define: {s:?} {}", last());
            let s = cairn_begin_step(f, step);
            prop_assert!(documented(s), "begin: {s:?} {}", last());
            // Data NULL: the call must refuse any block with bytes before reading it.
            let s = cairn_put(f, var.as_ptr(), null(), ndim, offset.as_ptr(), count.as_ptr());
            prop_assert!(documented(s), "put: {s:?} {}", last());
            let s = cairn_trace(f, var.as_ptr(), dtype.as_ptr(), null(), ndim, count.as_ptr());
            prop_assert!(documented(s), "trace: {s:?} {}", last());
            let s = cairn_end_step(f);
            prop_assert!(documented(s), "end: {s:?} {}", last());
            let mut out = [0u8; 64];
            let s = cairn_get(f, var.as_ptr(), step, ndim, offset.as_ptr(), count.as_ptr(), out.as_mut_ptr().cast(), out.len());
            prop_assert!(documented(s), "get: {s:?} {}", last());
            let s = cairn_close(f);
            prop_assert!(documented(s), "close: {s:?} {}", last());
        }
    }

    #[test]
    fn a_reader_answers_random_boxes_with_documented_statuses(
        ndim in -1i32..4,
        offset in proptest::collection::vec(extent(), 4),
        count in proptest::collection::vec(extent(), 4),
        step in prop_oneof![0u64..3, Just(u64::MAX)],
        out_bytes in prop_oneof![0usize..64, Just(800usize)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let (name, var, f8) = (CString::new("d").unwrap(), CString::new("v").unwrap(), CString::new("f8").unwrap());
        let mut f: *mut CairnFile = null_mut();
        let shape = [10u64, 10];
        let data = [1.5f64; 100];
        let mut out = vec![0u8; 800];
        // SAFETY: as above.
        unsafe {
            prop_assert_eq!(cairn_open(name.as_ptr(), c"w".as_ptr(), cfg.as_ptr(), 0, 1, &mut f), Status::CairnOk);
            prop_assert_eq!(cairn_define(f, var.as_ptr(), f8.as_ptr(), 2, shape.as_ptr()), Status::CairnOk);
            prop_assert_eq!(cairn_begin_step(f, 0), Status::CairnOk);
            prop_assert_eq!(cairn_put(f, var.as_ptr(), data.as_ptr().cast(), 2, [0u64, 0].as_ptr(), shape.as_ptr()), Status::CairnOk);
            prop_assert_eq!(cairn_end_step(f), Status::CairnOk);
            prop_assert_eq!(cairn_close(f), Status::CairnOk);
            prop_assert_eq!(cairn_open(name.as_ptr(), c"r".as_ptr(), cfg.as_ptr(), 0, 1, &mut f), Status::CairnOk);
            let s = cairn_get(f, var.as_ptr(), step, ndim, offset.as_ptr(), count.as_ptr(), out.as_mut_ptr().cast(), out_bytes);
            prop_assert!(documented(s), "get: {s:?} {}", last());
            prop_assert!(s == Status::CairnOk || !last().is_empty());
            prop_assert_eq!(cairn_close(f), Status::CairnOk);
        }
    }
}

#[test]
fn a_cluster_of_no_servers_or_bytes_is_refused_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let file = CString::new(dir.path().join("c.json").to_str().unwrap()).unwrap();
    let (small, fine) = (CString::new("10").unwrap(), CString::new("64MiB").unwrap());
    let started = std::time::Instant::now();
    // SAFETY: NUL-terminated strings.
    unsafe {
        assert_eq!(cairn_cluster_start(file.as_ptr(), 0, fine.as_ptr()), Status::CairnErrInvalidArgument, "{}", last());
        assert!(last().contains("1 or more servers"), "{}", last());
        assert_eq!(cairn_cluster_start(file.as_ptr(), u32::MAX, fine.as_ptr()), Status::CairnErrInvalidArgument);
        assert_eq!(cairn_cluster_start(file.as_ptr(), 1, small.as_ptr()), Status::CairnErrInvalidArgument);
        assert!(last().contains("at least 1 MiB"), "{}", last());
        assert_eq!(cairn_cluster_start(null::<c_char>(), 1, fine.as_ptr()), Status::CairnErrInvalidArgument);
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused at once");
}
