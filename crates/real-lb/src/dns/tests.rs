use super::*;

/// A response to `query` with `rcode`, the A records `addrs` (their names pointing at the
/// question's) and an EDNS OPT record in the additional section, as CoreDNS answers
/// HAProxy.
fn response(query: &[u8], rcode: u16, addrs: &[Ipv4Addr]) -> Vec<u8> {
    let mut packet = query[..2].to_vec();
    let answers = u16::try_from(addrs.len()).unwrap();
    for word in [0x8400 | 0x0100 | 0x0080 | rcode, 1, answers, 0, 1] {
        packet.extend_from_slice(&word.to_be_bytes());
    }
    packet.extend_from_slice(&query[HEADER..]);
    for addr in addrs {
        packet.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        packet.extend_from_slice(&addr.octets());
    }
    packet.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]);
    packet
}

#[test]
fn a_query_spells_the_name_as_labels_after_a_recursive_query_header() {
    let query = a_query(0x1234, "web.default.svc.cluster.local.").unwrap();
    assert_eq!(
        &query[..HEADER],
        &[0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        &query[HEADER..],
        b"\x03web\x07default\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01"
    );
    assert_eq!(
        query,
        a_query(0x1234, "web.default.svc.cluster.local").unwrap()
    );
}

#[test]
fn names_that_dns_cannot_carry_are_refused() {
    for name in ["", "a..b", &"x".repeat(64), &["abcdefgh"; 32].join(".")] {
        assert!(
            matches!(a_query(1, name), Err(Error::BadName(_))),
            "{name:?}"
        );
    }
}

#[test]
fn an_answer_gives_its_code_and_its_a_records_in_order() {
    let query = a_query(7, "web.default.svc.cluster.local").unwrap();
    let addrs = [Ipv4Addr::new(10, 64, 0, 3), Ipv4Addr::new(10, 64, 0, 2)];
    let answer = parse_answer(7, &response(&query, 0, &addrs)).unwrap();
    assert_eq!(
        answer,
        Answer {
            rcode: NOERROR,
            addrs: addrs.to_vec()
        }
    );
    let nx = parse_answer(7, &response(&query, 3, &[])).unwrap();
    assert_eq!((nx.rcode, nx.addrs.len()), (NXDOMAIN, 0));
}

#[test]
fn queries_truncated_messages_and_other_ids_are_not_answers() {
    let query = a_query(7, "web.default.svc.cluster.local").unwrap();
    let good = response(&query, 0, &[Ipv4Addr::new(10, 64, 0, 2)]);
    assert!(matches!(parse_answer(7, &query), Err(Error::Malformed(_))));
    assert!(matches!(parse_answer(8, &good), Err(Error::Malformed(_))));
    for cut in [0, 5, HEADER + 3, good.len() - 13, good.len() - 1] {
        assert!(
            matches!(parse_answer(7, &good[..cut]), Err(Error::Malformed(_))),
            "cut at {cut}"
        );
    }
}

#[test]
fn rewriting_changes_the_mapped_a_records_alone() {
    let query = a_query(9, "web.default.svc.cluster.local").unwrap();
    let pod = Ipv4Addr::new(10, 64, 0, 2);
    let other = Ipv4Addr::new(10, 96, 0, 1);
    let mut packet = response(&query, 0, &[pod, other]);
    let map = |a: Ipv4Addr| (a == pod).then_some(Ipv4Addr::new(127, 64, 0, 2));
    assert_eq!(rewrite_a(&mut packet, map).unwrap(), 1);
    let answer = parse_answer(9, &packet).unwrap();
    assert_eq!(answer.addrs, [Ipv4Addr::new(127, 64, 0, 2), other]);
    let mut truncated = packet[..packet.len() - 12].to_vec();
    let before = truncated.clone();
    assert!(rewrite_a(&mut truncated, map).is_err());
    assert_eq!(truncated, before);
}
