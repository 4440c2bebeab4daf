use std::net::{IpAddr, SocketAddr};

use super::*;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn socket(text: &str) -> Address {
    Address::Socket(text.parse::<SocketAddr>().unwrap())
}

#[test]
fn every_spelling_balancers_use_is_read() {
    let table = [
        ("10.42.1.17", Address::Ip(ip("10.42.1.17"))),
        ("10.42.1.17:8080", socket("10.42.1.17:8080")),
        (" 10.42.1.17:8080\n", socket("10.42.1.17:8080")),
        ("fd00:10:42::9", Address::Ip(ip("fd00:10:42::9"))),
        ("[fd00:10:42::9]", Address::Ip(ip("fd00:10:42::9"))),
        ("[fd00:10:42::9]:9000", socket("[fd00:10:42::9]:9000")),
        ("http://10.42.1.17:8080", socket("10.42.1.17:8080")),
        ("h2c://10.42.1.17:8080/", socket("10.42.1.17:8080")),
        (
            "https://user@10.42.1.17:8443/health?x=1",
            socket("10.42.1.17:8443"),
        ),
        (
            "http://[fd00:10:42::9]:9000/api",
            socket("[fd00:10:42::9]:9000"),
        ),
        ("http://10.42.1.17", Address::Ip(ip("10.42.1.17"))),
        ("http://10.42.1.17/path", Address::Ip(ip("10.42.1.17"))),
        ("::ffff:10.42.1.17", Address::Ip(ip("10.42.1.17"))),
        ("[::ffff:10.42.1.17]:8080", socket("10.42.1.17:8080")),
    ];
    for (text, expected) in table {
        assert_eq!(parse_address(text), Some(expected), "{text:?}");
    }
}

#[test]
fn names_sockets_and_blanks_are_not_addresses() {
    for text in [
        "",
        "unix",
        "web.shop.svc.cluster.local:8080",
        "http://web.shop.svc:8080",
        "10.42.1.17:http",
        "10.42.1.300",
        "[fd00::1",
    ] {
        assert_eq!(parse_address(text), None, "{text:?}");
    }
}

#[test]
fn a_port_matches_only_that_port_and_none_matches_every_port() {
    let routes: Routes = [socket("10.42.1.17:8080"), Address::Ip(ip("10.42.2.5"))]
        .into_iter()
        .collect();

    assert!(routes.routes_to(ip("10.42.1.17"), Some(8080)));
    assert!(!routes.routes_to(ip("10.42.1.17"), Some(9090)));
    assert!(routes.routes_to(ip("10.42.1.17"), None));
    // Reported without a port: the IP on every port.
    assert!(routes.routes_to(ip("10.42.2.5"), Some(9000)));
    assert!(routes.routes_to(ip("10.42.2.5"), None));
    assert!(!routes.routes_to(ip("10.42.1.18"), None));
}

#[test]
fn a_pod_ip_matches_its_ipv4_mapped_spelling_either_way() {
    let mapped: Routes = [parse_address("[::ffff:10.42.1.17]:8080").unwrap()]
        .into_iter()
        .collect();
    assert!(mapped.routes_to(ip("10.42.1.17"), Some(8080)));

    let plain: Routes = [socket("10.42.1.17:8080")].into_iter().collect();
    assert!(plain.routes_to(ip("::ffff:10.42.1.17"), Some(8080)));
}

#[test]
fn an_empty_answer_routes_to_nobody() {
    let routes = Routes::default();
    assert!(routes.is_empty());
    assert!(!routes.routes_to(ip("10.42.1.17"), None));
}

#[test]
fn with_port_fills_a_missing_port_and_keeps_a_given_one() {
    assert_eq!(
        Address::Ip(ip("10.0.0.1")).with_port(80),
        socket("10.0.0.1:80")
    );
    assert_eq!(
        socket("10.0.0.1:8080").with_port(80),
        socket("10.0.0.1:8080")
    );
}
