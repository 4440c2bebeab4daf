//! Against recorded answers: Envoy's admin `/clusters?format=json` (an EDS gateway with
//! three clusters of pods, one of them empty, an ext-authz cluster on a UNIX socket and
//! the xDS server) and Traefik's `/api/http/services` (internal services, a weighted
//! split and three load-balancing services).

use std::net::IpAddr;

use serde_json::{Value, json};

use super::*;

const ENVOY: &str = include_str!("../../tests/fixtures/envoy-clusters.json");
const TRAEFIK: &str = include_str!("../../tests/fixtures/traefik-http-services.json");

fn answer(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn spec(path: &str, address: Option<&str>, port: Option<&str>) -> JsonSpec {
    JsonSpec {
        path: Path::parse(path).unwrap(),
        address_field: address.map(|field| Field::parse(field).unwrap()),
        port_field: port.map(|field| Field::parse(field).unwrap()),
    }
}

fn envoy() -> JsonSpec {
    spec(
        "/cluster_statuses/*/host_statuses",
        Some("/address/socket_address/address"),
        Some("/address/socket_address/port_value"),
    )
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn listed(routes: &Routes) -> Vec<String> {
    routes.addresses().map(|a| format!("{a:?}")).collect()
}

#[test]
fn envoy_hosts_of_every_cluster_are_listed_with_their_ports() {
    let routes = envoy().routes(&answer(ENVOY)).unwrap();

    for (host, port) in [
        ("10.42.1.17", 8080),
        ("10.42.1.18", 8080),     // failing active health checks: still listed
        ("fd00:10:42::19", 8080), // pending_dynamic_removal: still listed
        ("10.42.2.5", 9000),
        ("10.42.2.6", 9000),
        ("10.43.0.15", 18000),
    ] {
        assert!(routes.routes_to(ip(host), Some(port)), "{host}:{port}");
    }
    assert!(!routes.routes_to(ip("10.42.1.17"), Some(9000)));
    assert_eq!(routes.len(), 6, "the UNIX socket host is passed over");
}

#[test]
fn envoy_without_a_port_field_matches_on_the_ip() {
    let routes = spec(
        "/cluster_statuses/*/host_statuses",
        Some("/address/socket_address/address"),
        None,
    )
    .routes(&answer(ENVOY))
    .unwrap();
    assert!(routes.routes_to(ip("10.42.1.17"), Some(8080)));
    assert!(routes.routes_to(ip("10.42.1.17"), Some(1)));
}

#[test]
fn one_envoy_cluster_by_index_and_its_hosts_by_wildcard() {
    let routes = spec(
        "/cluster_statuses/1/host_statuses/*/address/socket_address",
        Some("address"),
        Some("port_value"),
    )
    .routes(&answer(ENVOY))
    .unwrap();
    assert_eq!(
        listed(&routes),
        ["Socket(10.42.2.5:9000)", "Socket(10.42.2.6:9000)"]
    );
}

#[test]
fn an_empty_list_routes_to_nobody_but_a_missing_one_is_an_error() {
    let empty = envoy_path("/cluster_statuses/2/host_statuses");
    assert_eq!(empty.routes(&answer(ENVOY)), Ok(Routes::default()));

    for wrong in [
        "/cluster_statuses/9/host_statuses",
        "/cluster_statuses/*/hosts",
        "/clusters/*/host_statuses",
        "/cluster_statuses/01/host_statuses",
    ] {
        assert_eq!(
            envoy_path(wrong).routes(&answer(ENVOY)),
            Err(JsonError::NoMatch(wrong.into())),
            "{wrong}"
        );
    }
}

fn envoy_path(path: &str) -> JsonSpec {
    JsonSpec {
        path: Path::parse(path).unwrap(),
        ..envoy()
    }
}

#[test]
fn an_address_field_no_entry_has_is_an_error_not_an_empty_answer() {
    let wrong = spec(
        "/cluster_statuses/*/host_statuses",
        Some("/address/socket_address/ip"),
        None,
    );
    assert_eq!(
        wrong.routes(&answer(ENVOY)),
        Err(JsonError::NoAddress {
            path: "/cluster_statuses/*/host_statuses".into(),
            field: "/address/socket_address/ip".into(),
            entries: 7,
        })
    );
}

#[test]
fn traefik_load_balancer_servers_are_listed_and_other_services_passed_over() {
    let routes = spec("/*/loadBalancer/servers", Some("url"), None)
        .routes(&answer(TRAEFIK))
        .unwrap();
    assert_eq!(
        listed(&routes),
        [
            "Socket(10.42.1.17:8080)",
            "Socket(10.42.1.18:8080)",
            "Socket(10.42.1.31:8080)",
            "Socket(10.42.2.5:9000)", // DOWN in serverStatus: still listed
            "Socket(10.42.2.6:9000)",
            "Socket([fd00:10:42::19]:8080)",
        ]
    );
}

#[test]
fn a_path_to_traefik_s_status_map_is_an_error_not_an_empty_answer() {
    // The status map (url → UP/DOWN) is one object: an entry without a `url` member.
    let error = spec("/*/serverStatus", Some("url"), None)
        .routes(&answer(TRAEFIK))
        .unwrap_err();
    assert!(
        matches!(error, JsonError::NoAddress { entries: 1, .. }),
        "{error}"
    );
}

#[test]
fn a_list_of_address_strings_needs_no_field() {
    let doc = json!({"backends": ["10.0.0.1:80", "http://10.0.0.2:8080/", "[fd00::3]:443"]});
    let routes = spec("/backends", None, None).routes(&doc).unwrap();
    assert_eq!(routes.len(), 3);
    assert!(routes.routes_to(ip("10.0.0.2"), Some(8080)));
}

#[test]
fn the_whole_answer_may_be_the_list() {
    let doc = json!(["10.0.0.1", "10.0.0.2"]);
    let routes = spec("", None, None).routes(&doc).unwrap();
    assert!(routes.routes_to(ip("10.0.0.1"), Some(80)));
    assert_eq!(
        spec("", None, None).routes(&json!([])),
        Ok(Routes::default())
    );
}

#[test]
fn a_host_name_is_an_error_it_might_be_the_pod() {
    let doc = json!({"servers": [{"url": "http://10.0.0.1:80"}, {"url": "http://web.shop:80"}]});
    assert_eq!(
        spec("/servers", Some("url"), None).routes(&doc),
        Err(JsonError::BadAddress {
            at: "/servers/1/url".into(),
            value: "http://web.shop:80".into()
        })
    );
}

#[test]
fn values_of_the_wrong_type_are_errors_naming_their_place() {
    let doc = json!({"servers": [{"ip": 10}]});
    let error = spec("/servers", Some("ip"), None).routes(&doc).unwrap_err();
    assert_eq!(error.to_string(), "/servers/0/ip is a number, not a string");

    let doc = json!({"servers": [{"ip": "10.0.0.1", "port": 70000}]});
    let error = spec("/servers", Some("ip"), Some("port"))
        .routes(&doc)
        .unwrap_err();
    assert_eq!(error.to_string(), "/servers/0/port is 70000, not a port");

    // Without an address field the entries must be strings.
    let doc = json!({"servers": [{"ip": "10.0.0.1"}]});
    assert!(matches!(
        spec("/servers", None, None).routes(&doc),
        Err(JsonError::WrongType {
            found: "an object",
            ..
        })
    ));
}

#[test]
fn a_port_may_be_a_string_and_an_address_s_own_port_wins() {
    let doc = json!({"servers": [
        {"ip": "10.0.0.1", "port": "8080"},
        {"ip": "10.0.0.2:9090", "port": 8080},
        {"ip": "10.0.0.3"},
    ]});
    let routes = spec("/servers", Some("ip"), Some("port"))
        .routes(&doc)
        .unwrap();
    assert_eq!(
        listed(&routes),
        [
            "Socket(10.0.0.1:8080)",
            "Socket(10.0.0.2:9090)",
            "Ip(10.0.0.3)"
        ]
    );
}

#[test]
fn wildcards_cross_object_members_and_escapes_are_read() {
    let doc = json!({"services": {
        "web@docker": {"loadBalancer": {"servers": [{"url": "http://10.0.0.1:80"}]}},
        "a/b~c": {"loadBalancer": {"servers": [{"url": "http://10.0.0.2:80"}]}},
    }});
    let all = spec("/services/*/loadBalancer/servers", Some("url"), None);
    assert_eq!(all.routes(&doc).unwrap().len(), 2);

    let one = spec("/services/a~1b~0c/loadBalancer/servers", Some("url"), None);
    assert_eq!(listed(&one.routes(&doc).unwrap()), ["Socket(10.0.0.2:80)"]);
}

#[test]
fn a_path_that_is_not_a_pointer_is_refused() {
    assert!(matches!(
        Path::parse("cluster_statuses/*"),
        Err(JsonError::BadPointer { .. })
    ));
    assert!(matches!(
        Path::parse("/a~2"),
        Err(JsonError::BadPointer { .. })
    ));
    assert!(matches!(
        Field::parse("/a~"),
        Err(JsonError::BadPointer { .. })
    ));
    assert_eq!(Field::parse("a/b").unwrap().pointer, "/a~1b");
}
