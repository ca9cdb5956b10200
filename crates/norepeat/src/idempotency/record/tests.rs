//! The record format: round trips, sizes, both versions, refusals.

use super::*;
use proptest::prelude::*;

#[test]
fn in_progress_round_trips_and_is_12_bytes() {
    let owner: Owner = std::array::from_fn(|i| u8::try_from(i + 1).unwrap());
    let fingerprint: Digest = std::array::from_fn(|i| u8::try_from(i + 100).unwrap());
    let deadline_ms = 1_800_000_000_123;
    let b = in_progress(&owner, &fingerprint, 3, deadline_ms);
    assert_eq!(b.len(), 12, "the 32-byte allocation class on Redis");
    assert_eq!(&b[..2], &[VERSION_4, IN_PROGRESS]);
    let r = decode(&Bytes::from(b)).unwrap();
    let mut kept = [0; 16];
    kept[..OWNER_BYTES_V4].copy_from_slice(&owner[..OWNER_BYTES_V4]);
    assert_eq!(r.owner, kept);
    assert_eq!(r.fingerprint[..3], fingerprint[..3]);
    assert_eq!(r.fingerprint_len, 3);
    assert!(r.completed.is_none());
    let lease = r.lease.expect("a version-4 record carries its lease");
    assert_eq!(lease.attempt, 3);
    assert_eq!(lease.deadline, crate::claim::stamp(deadline_ms));
    assert!(!crate::claim::passed(lease.deadline, deadline_ms - 1, 0));
    assert!(crate::claim::passed(lease.deadline, deadline_ms + 20, 0));
    // The request it was written for, and no other as far as 24 bits go.
    assert!(r.is_for(&fingerprint));
    let mut other = fingerprint;
    other[2] ^= 1;
    assert!(!r.is_for(&other));
}

/// An unknown outcome keeps the claim's fingerprint and attempt and the
/// status the client was told: 14 bytes, never renewed, never released.
#[test]
fn an_unknown_outcome_round_trips_with_its_status() {
    let fingerprint: Digest = std::array::from_fn(|i| u8::try_from(i + 100).unwrap());
    let b = unknown(&[7; 16], &fingerprint, 2, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(b.len(), 14);
    assert_eq!(&b[..2], &[VERSION_4, UNKNOWN]);
    assert!(restamp(&b, 5).is_none());
    assert!(released(&b).is_none());
    let r = decode(&Bytes::from(b)).unwrap();
    assert_eq!(r.unknown, Some(StatusCode::GATEWAY_TIMEOUT));
    assert_eq!(r.lease.map(|l| l.attempt), Some(2));
    assert!(r.completed.is_none() && !r.released);
    assert!(r.is_for(&fingerprint));
    // A claim is not an unknown outcome.
    let claim = decode(&Bytes::from(in_progress(&[7; 16], &fingerprint, 2, 9))).unwrap();
    assert_eq!(claim.unknown, None);
}

/// A renewal moves the deadline and nothing else; a record that is not a
/// version-4 claim is never restamped.
#[test]
fn a_renewal_moves_only_the_deadline() {
    let b = in_progress(&[7; 16], &[8; 16], 1, 1_000);
    let renewed = restamp(&b, 9_990).unwrap();
    assert_eq!(renewed.len(), b.len());
    assert_eq!(renewed[..8], b[..8]);
    let r = decode(&Bytes::from(renewed)).unwrap();
    assert_eq!(r.lease.unwrap().deadline, crate::claim::stamp(9_990));
    assert_eq!(r.lease.unwrap().attempt, 1);
    let mut v3 = vec![VERSION_3, IN_PROGRESS];
    v3.extend_from_slice(&[1; 10]);
    assert!(restamp(&v3, 5).is_none());
    let done = completed(&[0; 16], &[0; 16], StatusCode::OK, [], b"x");
    assert!(restamp(&done, 5).is_none());
}

#[test]
fn version_3_in_progress_records_are_still_read_without_a_lease() {
    // What the release before version 4 wrote: 12 bytes, no deadline.
    let mut b = vec![VERSION_3, IN_PROGRESS];
    b.extend_from_slice(&[5; 4]);
    b.extend_from_slice(&[6; 6]);
    let r = decode(&Bytes::from(b)).unwrap();
    assert_eq!((r.fingerprint_len, r.lease), (4, None));
    assert!(r.completed.is_none());
    assert!(r.is_for(&[5; 16]));
}

#[test]
fn version_2_in_progress_records_are_still_read() {
    // What the release before version 3 wrote: 28 bytes.
    let mut b = vec![VERSION_2, IN_PROGRESS];
    b.extend_from_slice(&[2; 16]);
    b.extend_from_slice(&[9; OWNER_BYTES_V2]);
    let r = decode(&Bytes::from(b)).unwrap();
    let mut kept = [0; 16];
    kept[..OWNER_BYTES_V2].copy_from_slice(&[9; OWNER_BYTES_V2]);
    assert_eq!(
        (r.owner, r.fingerprint, r.fingerprint_len),
        (kept, [2; 16], 16)
    );
    assert!(r.completed.is_none());
    assert!(r.is_for(&[2; 16]));
    let mut other = [2; 16];
    other[15] = 3;
    assert!(
        !r.is_for(&other),
        "all 16 bytes of a version-2 record count"
    );
}

#[test]
fn claims_with_different_owners_write_different_bytes() {
    let mut other = [1; 16];
    other[OWNER_BYTES_V4 - 1] = 2;
    assert_ne!(
        in_progress(&[1; 16], &[2; 16], 1, 5_000),
        in_progress(&other, &[2; 16], 1, 5_000)
    );
    // And a take-over (the next attempt) writes other bytes than the
    // claim it takes over, whatever the owners.
    assert_ne!(
        in_progress(&[1; 16], &[2; 16], 1, 5_000),
        in_progress(&[1; 16], &[2; 16], 2, 5_000)
    );
}

#[test]
fn a_completed_64_byte_body_with_its_content_type_is_105_bytes() {
    let ct = (
        HeaderName::from_static("content-type"),
        HeaderValue::from_static("application/json"),
    );
    let b = completed(
        &[3; 16],
        &[4; 16],
        StatusCode::CREATED,
        [(&ct.0, &ct.1)],
        &[b'x'; 64],
    );
    assert_eq!(b.len(), 105);
    let r = decode(&Bytes::from(b)).unwrap();
    assert_eq!(r.owner, [0; 16], "a completed record keeps no owner");
    assert_eq!(r.fingerprint, [4; 16]);
}

/// A version-1 record, as the previous release wrote it.
fn v1(state: u8, tail: &[u8]) -> Bytes {
    let mut b = vec![VERSION_1, state];
    b.extend_from_slice(&[5; 16]);
    b.extend_from_slice(&[6; 16]);
    b.extend_from_slice(tail);
    Bytes::from(b)
}

#[test]
fn version_1_records_are_still_read() {
    let r = decode(&v1(IN_PROGRESS, &[])).unwrap();
    assert_eq!((r.owner, r.fingerprint), ([5; 16], [6; 16]));
    assert!(r.completed.is_none());
    let mut tail = Vec::new();
    tail.extend_from_slice(&201u16.to_be_bytes());
    tail.extend_from_slice(&1u16.to_be_bytes());
    tail.extend_from_slice(&4u16.to_be_bytes());
    tail.extend_from_slice(b"etag");
    tail.extend_from_slice(&3u32.to_be_bytes());
    tail.extend_from_slice(b"\"x\"");
    tail.extend_from_slice(b"body");
    let c = decode(&v1(COMPLETED, &tail)).unwrap().completed.unwrap();
    assert_eq!(c.status, StatusCode::CREATED);
    assert_eq!(
        c.headers,
        vec![(
            HeaderName::from_static("etag"),
            HeaderValue::from_static("\"x\"")
        )]
    );
    assert_eq!(&c.body[..], b"body");
    assert!(decode(&v1(IN_PROGRESS, &[0])).is_err());
}

#[test]
fn headers_that_do_not_fit_are_left_out() {
    let long = HeaderValue::from_bytes(&vec![b'a'; 70_000]).unwrap();
    let name = HeaderName::from_static("x-long");
    let ok = (
        HeaderName::from_static("etag"),
        HeaderValue::from_static("\"x\""),
    );
    let b = completed(
        &[0; 16],
        &[0; 16],
        StatusCode::OK,
        [(&name, &long), (&ok.0, &ok.1)],
        b"",
    );
    let c = decode(&Bytes::from(b)).unwrap().completed.unwrap();
    assert_eq!(c.headers, vec![ok]);
}

/// The other two limits of the module docs: a header name over 255 bytes
/// is left out (255 is kept), and of 300 headers the first 255 are kept,
/// in order.
#[test]
fn long_names_and_headers_past_the_255th_are_left_out() {
    let v = HeaderValue::from_static("v");
    let kept = HeaderName::from_bytes(&[b'k'; 255]).unwrap();
    let left = HeaderName::from_bytes(&[b'l'; 256]).unwrap();
    let b = completed(
        &[0; 16],
        &[0; 16],
        StatusCode::OK,
        [(&left, &v), (&kept, &v)],
        b"",
    );
    let c = decode(&Bytes::from(b)).unwrap().completed.unwrap();
    assert_eq!(c.headers, vec![(kept, v.clone())]);

    let many: Vec<(HeaderName, HeaderValue)> = (0..300)
        .map(|i| {
            (
                HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(),
                v.clone(),
            )
        })
        .collect();
    let b = completed(
        &[0; 16],
        &[0; 16],
        StatusCode::OK,
        many.iter().map(|(n, v)| (n, v)),
        b"",
    );
    let c = decode(&Bytes::from(b)).unwrap().completed.unwrap();
    assert_eq!(c.headers, many[..255].to_vec());
}

#[test]
fn well_known_and_other_header_names_round_trip() {
    let headers = [
        (
            HeaderName::from_static("x-request-id"),
            HeaderValue::from_static("1"),
        ),
        (
            HeaderName::from_static("link"),
            HeaderValue::from_static("</a>"),
        ),
        (
            HeaderName::from_static("content-type"),
            HeaderValue::from_static("text/plain"),
        ),
    ];
    let b = completed(
        &[0; 16],
        &[0; 16],
        StatusCode::OK,
        headers.iter().map(|(n, v)| (n, v)),
        b"x",
    );
    let c = decode(&Bytes::from(b.clone())).unwrap().completed.unwrap();
    assert_eq!(c.headers, headers.to_vec());
    let mut bad = b;
    // The first header's name replaced by an index past the table.
    let at = HEAD + 3;
    bad.splice(at..at + 13, [0, 200]);
    assert!(decode(&Bytes::from(bad)).is_err());
}

#[test]
fn completed_round_trips() {
    let ct = (
        HeaderName::from_static("content-type"),
        HeaderValue::from_static("application/json"),
    );
    let loc = (
        HeaderName::from_static("location"),
        HeaderValue::from_static("/payments/1"),
    );
    let body = b"{\"a\":1}\x00\xff";
    let b = completed(
        &[3; 16],
        &[4; 16],
        StatusCode::CREATED,
        [(&ct.0, &ct.1), (&loc.0, &loc.1)],
        body,
    );
    let r = decode(&Bytes::from(b)).unwrap();
    let c = r.completed.unwrap();
    assert_eq!(c.status, StatusCode::CREATED);
    assert_eq!(c.headers, vec![ct, loc]);
    assert_eq!(&c.body[..], body);
}

#[test]
fn rejects_what_it_does_not_understand() {
    assert!(decode(&Bytes::new()).is_err());
    assert!(decode(&Bytes::from_static(b"{\"json\":true}")).is_err());
    let mut b = in_progress(&[0; 16], &[0; 16], 1, 0);
    b[0] = 9;
    assert!(decode(&Bytes::from(b)).is_err());
    let mut b = in_progress(&[0; 16], &[0; 16], 1, 0);
    b.push(0);
    assert!(decode(&Bytes::from(b)).is_err());
    let mut b = in_progress(&[0; 16], &[0; 16], 1, 0);
    b.pop();
    assert!(decode(&Bytes::from(b)).is_err());
    let mut b = in_progress(&[0; 16], &[0; 16], 1, 0);
    b[1] = COMPLETED;
    assert!(
        decode(&Bytes::from(b)).is_err(),
        "version 4 is never completed"
    );
    let h = (
        HeaderName::from_static("etag"),
        HeaderValue::from_static("\"x\""),
    );
    let b = completed(&[0; 16], &[0; 16], StatusCode::OK, [(&h.0, &h.1)], b"");
    assert!(decode(&Bytes::from(b[..b.len() - 1].to_vec())).is_err());
}

proptest! {
    /// Any body and status survive the trip; any cut of a completed
    /// record's head is refused, never misread.
    #[test]
    fn bodies_round_trip(body in proptest::collection::vec(any::<u8>(), 0..512), status in 200u16..600) {
        let status = StatusCode::from_u16(status).unwrap();
        let b = completed(&[7; 16], &[8; 16], status, [], &body);
        let c = decode(&Bytes::from(b.clone())).unwrap().completed.unwrap();
        prop_assert_eq!(c.status, status);
        prop_assert_eq!(&c.body[..], &body[..]);
        for cut in 0..HEAD + 3 {
            prop_assert!(decode(&Bytes::from(b[..cut].to_vec())).is_err());
        }
    }
}

/// A record of a success whose body was not kept is a plain version-2
/// completed record (what the release before this one reads and replays
/// as it is): the status, the headers but those describing the body, the
/// header `Idempotent-Body: omitted` spelled out, and no body.
#[test]
fn a_record_without_its_body_is_a_version_2_completed_record() {
    let location = HeaderValue::from_static("/payments/p1");
    let json = HeaderValue::from_static("application/json");
    let headers = [
        (&http::header::CONTENT_TYPE, &json),
        (&http::header::LOCATION, &location),
    ];
    let b = completed_without_body(&[1; 16], &[2; 16], StatusCode::CREATED, headers);
    assert_eq!(&b[..2], &[VERSION_2, COMPLETED]);
    let r = decode(&Bytes::from(b)).unwrap();
    assert_eq!(r.fingerprint, [2; 16]);
    let done = r.completed.unwrap();
    assert_eq!(done.status, StatusCode::CREATED);
    assert!(done.body.is_empty());
    assert_eq!(
        done.headers,
        vec![
            (http::header::LOCATION, location),
            (IDEMPOTENT_BODY, HeaderValue::from_static("omitted")),
        ]
    );
}
