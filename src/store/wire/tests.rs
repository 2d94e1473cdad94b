//! Encoding and decoding of every request against hand-written bytes,
//! and the limits.

use super::*;

fn s(b: &[u8]) -> Vec<u8> {
    b.to_vec()
}
/// `u64 len` + bytes, little-endian.
fn lp(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(b);
    v
}
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn validate_is_exact_bytes() {
    assert_eq!(
        Request::Validate(VALIDATION_MAGIC).to_bytes(),
        vec![0x00, 0xCE, 0xF7, 0x85, 0x3C]
    );
}

#[test]
fn ping_is_code_13_and_le_nonce() {
    assert_eq!(
        Request::Ping(0x0102_0304).to_bytes(),
        vec![13, 0x04, 0x03, 0x02, 0x01]
    );
}

fn golden() -> Vec<(Request, Vec<u8>)> {
    let k = lp(b"/k");
    let v = lp(b"val");
    let e = lp(b"");
    vec![
        (
            Request::Validate(VALIDATION_MAGIC),
            vec![0, 0xCE, 0xF7, 0x85, 0x3C],
        ),
        (
            Request::Set {
                key: s(b"/k"),
                value: s(b"val"),
            },
            cat(&[&[1], &k, &v]),
        ),
        (
            Request::CompareSet {
                key: s(b"/k"),
                expected: vec![],
                desired: s(b"val"),
            },
            cat(&[&[2], &k, &e, &v]),
        ),
        (Request::Get(s(b"/k")), cat(&[&[3], &k])),
        (
            Request::Add {
                key: s(b"/k"),
                delta: -2,
            },
            cat(&[&[4], &k, &(-2i64).to_le_bytes()]),
        ),
        (
            Request::Check(vec![s(b"/k"), s(b"/k")]),
            cat(&[&[5], &2u64.to_le_bytes(), &k, &k]),
        ),
        (
            Request::Wait(vec![s(b"/k")]),
            cat(&[&[6], &1u64.to_le_bytes(), &k]),
        ),
        (Request::GetNumKeys, vec![7]),
        (Request::DeleteKey(s(b"/k")), cat(&[&[8], &k])),
        (
            Request::Append {
                key: s(b"/k"),
                value: s(b"val"),
            },
            cat(&[&[9], &k, &v]),
        ),
        (
            Request::MultiGet(vec![s(b"/k")]),
            cat(&[&[10], &1u64.to_le_bytes(), &k]),
        ),
        (
            Request::MultiSet(vec![(s(b"/k"), s(b"val"))]),
            cat(&[&[11], &1u64.to_le_bytes(), &k, &v]),
        ),
        (Request::CancelWait, vec![12]),
        (Request::Ping(7), vec![13, 7, 0, 0, 0]),
        (
            Request::QueuePush {
                key: s(b"/k"),
                value: s(b"val"),
            },
            cat(&[&[14], &k, &v]),
        ),
        (Request::QueuePop(s(b"/k")), cat(&[&[15], &k])),
        (Request::QueueLen(s(b"/k")), cat(&[&[16], &k])),
        (Request::ListKeys, vec![17]),
        (
            Request::Barrier {
                key: s(b"/k"),
                world_size: 4,
            },
            cat(&[&[18], &k, &4i64.to_le_bytes()]),
        ),
    ]
}

#[test]
fn every_request_encodes_to_golden_bytes_and_decodes_back() {
    let g = golden();
    assert_eq!(g.len(), 19, "one case per query code 0..=18");
    for (i, (req, bytes)) in g.iter().enumerate() {
        assert_eq!(req.code() as usize, i);
        assert_eq!(&req.to_bytes(), bytes, "{req:?}");
        let (back, used) = decode_request(bytes).unwrap();
        assert_eq!(&back, req);
        assert_eq!(used, bytes.len());
        // Every strict prefix is incomplete, never malformed.
        for cut in 0..bytes.len() {
            assert_eq!(
                decode_request(&bytes[..cut]).unwrap_err(),
                Decode::Incomplete,
                "{req:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn literal_set_bytes() {
    // SET "/a" = "xy", spelled out byte by byte.
    let expect = [
        1, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b'a', 2, 0, 0, 0, 0, 0, 0, 0, b'x', b'y',
    ];
    assert_eq!(
        Request::Set {
            key: s(b"/a"),
            value: s(b"xy")
        }
        .to_bytes(),
        expect
    );
}

#[test]
fn replies_read_back() {
    let mut bytes = Vec::new();
    put_u8(&mut bytes, READY);
    put_i64(&mut bytes, 21);
    put_bytes(&mut bytes, b"6");
    put_u32(&mut bytes, 0xdead_beef);
    assert_eq!(
        bytes,
        cat(&[
            &[0],
            &21i64.to_le_bytes(),
            &lp(b"6"),
            &[0xef, 0xbe, 0xad, 0xde]
        ])
    );
    let mut src = &bytes[..];
    let mut r = ReplyReader { inner: &mut src };
    assert_eq!(r.u8().unwrap(), READY);
    assert_eq!(r.i64().unwrap(), 21);
    assert_eq!(r.bytes().unwrap(), b"6");
    assert_eq!(r.u32().unwrap(), 0xdead_beef);
}

#[test]
fn limits_and_unknown_codes_are_malformed() {
    assert!(matches!(decode_request(&[19]), Err(Decode::Malformed(_))));
    assert!(matches!(decode_request(&[255]), Err(Decode::Malformed(_))));
    let mut big_key = vec![SET];
    put_u64(&mut big_key, MAX_KEY_LEN as u64 + 1);
    assert!(matches!(
        decode_request(&big_key),
        Err(Decode::Malformed(_))
    ));
    let mut big_val = vec![SET];
    put_bytes(&mut big_val, b"k");
    put_u64(&mut big_val, MAX_VALUE_LEN as u64 + 1);
    assert!(matches!(
        decode_request(&big_val),
        Err(Decode::Malformed(_))
    ));
    let mut many = vec![WAIT];
    put_u64(&mut many, MAX_KEYS_PER_REQUEST as u64 + 1);
    assert!(matches!(decode_request(&many), Err(Decode::Malformed(_))));
    let mut huge = vec![MULTI_GET];
    put_u64(&mut huge, u64::MAX);
    assert!(matches!(decode_request(&huge), Err(Decode::Malformed(_))));
}

#[test]
fn auth_round_trips_and_needs_its_magic() {
    let req = Request::Auth(s(b"tok"));
    let bytes = req.to_bytes();
    assert_eq!(
        bytes,
        cat(&[&[AUTH], &AUTH_MAGIC.to_le_bytes(), &lp(b"tok")])
    );
    assert_eq!(decode_request(&bytes).unwrap(), (req, bytes.len()));
    let stray = cat(&[&[AUTH], &0u32.to_le_bytes(), &lp(b"tok")]);
    assert!(matches!(decode_request(&stray), Err(Decode::Malformed(_))));
    let mut long = cat(&[&[AUTH], &AUTH_MAGIC.to_le_bytes()]);
    put_u64(&mut long, MAX_TOKEN_LEN as u64 + 1);
    assert!(matches!(decode_request(&long), Err(Decode::Malformed(_))));
}

#[test]
fn client_side_limits_name_the_limit() {
    let key = vec![b'k'; MAX_KEY_LEN + 1];
    let e = check_limits(&Request::Get(key.clone())).unwrap_err();
    assert!(e.contains("key limit of 8192"), "{e}");
    assert!(check_limits(&Request::Get(vec![b'k'; MAX_KEY_LEN])).is_ok());
    let e = check_limits(&Request::Set {
        key: s(b"/k"),
        value: vec![0; MAX_VALUE_LEN + 1],
    })
    .unwrap_err();
    assert!(e.contains("value limit of 8388608"), "{e}");
    let e = check_limits(&Request::Wait(vec![s(b"/k"); MAX_KEYS_PER_REQUEST + 1])).unwrap_err();
    assert!(e.contains("limit of 131072"), "{e}");
    let e = check_limits(&Request::MultiSet(vec![(key, s(b"v"))])).unwrap_err();
    assert!(e.contains("key limit"), "{e}");
}
