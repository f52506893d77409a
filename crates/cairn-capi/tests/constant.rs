//! Step-invariant variables through the C API (issue 43): `cairn_define_ex(..., constant)`, a second
//! write refused with `CAIRN_ERR_CONFLICT`, and `cairn_constant_step` to find it for reading.

use cairn::*;
use std::ffi::CString;
use std::ptr::{null, null_mut};

#[test]
fn a_constant_is_written_once_and_found_by_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.toml");
    std::fs::write(&path, format!("engine = \"file\"\n[file]\npath = \"{}\"\n", dir.path().display())).unwrap();
    let cfg = CString::new(path.to_str().unwrap()).unwrap();
    let x: Vec<f64> = (0..4).map(f64::from).collect();
    let (shape, offset) = ([4u64], [0u64]);
    // SAFETY: valid handles, NUL-terminated strings and buffers of the sizes given, as the
    // header's contracts ask.
    unsafe {
        let mut w: *mut CairnFile = null_mut();
        assert_eq!(cairn_open(c"grid".as_ptr(), c"w".as_ptr(), cfg.as_ptr(), 0, 1, &mut w), Status::CairnOk);
        assert_eq!(cairn_define_ex(w, c"x".as_ptr(), c"f8".as_ptr(), 1, shape.as_ptr(), null(), null(), 1), Status::CairnOk);
        assert_eq!(cairn_define(w, c"u".as_ptr(), c"f8".as_ptr(), 1, shape.as_ptr()), Status::CairnOk);
        assert_eq!(cairn_define_ex(w, c"bad".as_ptr(), c"f8".as_ptr(), -1, null(), null(), null(), 1), Status::CairnErrInvalidArgument);
        for step in 0..2u64 {
            assert_eq!(cairn_begin_step(w, step), Status::CairnOk);
            if step == 0 {
                assert_eq!(cairn_put(w, c"x".as_ptr(), x.as_ptr().cast(), 1, offset.as_ptr(), shape.as_ptr()), Status::CairnOk);
            } else {
                let again = cairn_put(w, c"x".as_ptr(), x.as_ptr().cast(), 1, offset.as_ptr(), shape.as_ptr());
                assert_eq!(again, Status::CairnErrConflict);
            }
            assert_eq!(cairn_put(w, c"u".as_ptr(), x.as_ptr().cast(), 1, offset.as_ptr(), shape.as_ptr()), Status::CairnOk);
            assert_eq!(cairn_end_step(w), Status::CairnOk);
        }
        assert_eq!(cairn_close(w), Status::CairnOk);
        let mut r: *mut CairnFile = null_mut();
        assert_eq!(cairn_open(c"grid".as_ptr(), c"r".as_ptr(), cfg.as_ptr(), 0, 1, &mut r), Status::CairnOk);
        let mut step = u64::MAX;
        assert_eq!(cairn_constant_step(r, c"x".as_ptr(), &mut step), Status::CairnOk);
        assert_eq!(step, 0);
        assert_eq!(cairn_constant_step(r, c"u".as_ptr(), &mut step), Status::CairnErrInvalidArgument);
        let mut out = vec![0f64; 4];
        let got = cairn_get(r, c"x".as_ptr(), 0, 1, offset.as_ptr(), shape.as_ptr(), out.as_mut_ptr().cast(), 32);
        assert_eq!((got, out), (Status::CairnOk, x));
        assert_eq!(cairn_close(r), Status::CairnOk);
    }
}
