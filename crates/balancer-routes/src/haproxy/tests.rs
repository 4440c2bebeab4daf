//! Against HAProxy 2.6's statistics as its stats page serves them (`stats show-legends`),
//! for this configuration:
//!
//! ```text
//! listen stats            (bind :8404, stats uri /stats, stats show-legends)
//! frontend fe_http        (bind :80)
//! backend be_web
//!     server-template web 4 _http._tcp.web.shop.svc.cluster.local resolvers kube init-addr none check
//!     # web1 UP, web2 UP 2/3 (failing checks), web3 and web4 MAINT (resolution): no SRV record
//! backend be_api
//!     server api1..api7 <ip>:9000 check
//!     # api1 DOWN, api2 DRAIN, api3 MAINT, api4 `no check` (IPv6), api5 MAINT (resolution)
//!     # (its name stopped resolving, the last address kept), api6 DOWN 1/2, api7 NOLB
//! ```

use std::net::IpAddr;

use super::*;

const STATS: &str = include_str!("../../tests/fixtures/haproxy-2.6-stats.csv");
const NO_LEGENDS: &str = include_str!("../../tests/fixtures/haproxy-2.6-stats-no-legends.csv");

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn listed(routes: &Routes) -> Vec<String> {
    routes
        .addresses()
        .map(|address| match address {
            Address::Socket(socket) => socket.to_string(),
            Address::Ip(ip) => ip.to_string(),
        })
        .collect()
}

#[test]
fn every_backend_s_routing_servers_are_listed() {
    let routes = parse_stats(STATS, None).unwrap();

    let mut expected = vec![
        "10.42.1.17:8080",      // web1 UP
        "10.42.1.18:8080",      // web2 UP 2/3
        "10.42.2.6:9000",       // api2 DRAIN: persistent connections still arrive
        "[fd00:10:42::9]:9000", // api4 no check
        "10.42.2.10:9000",      // api6 DOWN 1/2: rising
        "10.42.2.11:9000",      // api7 NOLB: persistent connections still arrive
    ];
    expected.sort_by_key(|text| text.parse::<std::net::SocketAddr>().unwrap());
    assert_eq!(listed(&routes), expected);
}

#[test]
fn down_and_maintenance_servers_do_not_route() {
    let routes = parse_stats(STATS, None).unwrap();

    assert!(!routes.routes_to(ip("10.42.2.5"), Some(9000)), "api1 DOWN");
    assert!(!routes.routes_to(ip("10.42.2.7"), Some(9000)), "api3 MAINT");
    assert!(
        !routes.routes_to(ip("10.42.2.9"), Some(9000)),
        "api5 MAINT (resolution) keeps its last address"
    );
}

#[test]
fn frontends_and_backends_are_not_servers() {
    let routes = parse_stats(STATS, Some("stats")).unwrap();
    assert!(routes.is_empty());
}

#[test]
fn a_backend_counts_its_own_servers_only() {
    let web = parse_stats(STATS, Some("be_web")).unwrap();
    assert_eq!(listed(&web), ["10.42.1.17:8080", "10.42.1.18:8080"]);
    assert!(!web.routes_to(ip("10.42.2.6"), None));
}

#[test]
fn an_unknown_backend_is_an_error_not_an_empty_answer() {
    assert_eq!(
        parse_stats(STATS, Some("be_wbe")),
        Err(CsvError::NoBackend("be_wbe".into()))
    );
    // A frontend is not a backend either.
    assert_eq!(
        parse_stats(STATS, Some("fe_http")),
        Err(CsvError::NoBackend("fe_http".into()))
    );
}

#[test]
fn hidden_addresses_of_routing_servers_are_an_error_naming_the_cure() {
    let error = parse_stats(NO_LEGENDS, Some("be_web")).unwrap_err();
    assert_eq!(
        error,
        CsvError::NoAddress {
            backend: "be_web".into(),
            server: "web1".into(),
            status: "UP".into()
        }
    );
    assert!(error.to_string().contains("stats show-legends"), "{error}");
}

#[test]
fn without_legends_a_backend_with_no_routing_server_still_reads() {
    let csv = "# pxname,svname,status,addr,type,\n\
               be_old,old1,MAINT,,2,\n\
               be_old,BACKEND,DOWN,,1,\n";
    assert!(parse_stats(csv, Some("be_old")).unwrap().is_empty());
}

#[test]
fn statuses_route_as_the_module_head_says() {
    let table = [
        ("UP", true),
        ("UP 2/3", true),
        ("no check", true),
        ("NOLB", true),
        ("NOLB 1/2", true),
        ("DRAIN", true),
        ("DRAIN 1/3", true),
        ("DRAIN (agent)", true),
        ("DOWN 1/2", true),
        ("DOWN", false),
        ("DOWN (agent)", false),
        ("MAINT", false),
        ("MAINT (via be_api/api1)", false),
        ("MAINT (resolution)", false),
        ("SOMETHING NEW", true),
    ];
    for (status, routes) in table {
        assert_eq!(status_routes(status), routes, "{status:?}");
    }
}

#[test]
fn columns_are_found_by_name_wherever_they_are() {
    let csv = "# addr,type,svname,status,pxname,\n\
               10.0.0.1:80,2,s1,UP,be,\n\
               10.0.0.2:80,2,s2,MAINT,be,\n";
    let routes = parse_stats(csv, Some("be")).unwrap();
    assert_eq!(listed(&routes), ["10.0.0.1:80"]);
}

#[test]
fn without_a_type_column_the_svname_tells_servers_apart() {
    let csv = "# pxname,svname,status,addr\n\
               fe,FRONTEND,OPEN,10.0.0.9:80\n\
               be,s1,UP,10.0.0.1:80\n\
               be,BACKEND,UP,\n";
    let routes = parse_stats(csv, Some("be")).unwrap();
    assert_eq!(listed(&routes), ["10.0.0.1:80"]);
}

#[test]
fn listeners_are_not_servers() {
    // `option socket-stats` adds a row per listener, with the bind address as `addr`.
    let csv = "# pxname,svname,status,addr,type,\n\
               fe,FRONTEND,OPEN,,0,\n\
               fe,sock-1,OPEN,10.0.0.9:80,3,\n";
    assert!(parse_stats(csv, None).unwrap().is_empty());
}

#[test]
fn quoted_fields_with_commas_quotes_and_line_breaks_are_read() {
    let csv = "# pxname,svname,last_chk,status,addr,type,\n\
               be,s1,\"HTTP \"\"503\"\", retry, later\",UP,10.0.0.1:80,2,\n\
               be,s2,\"two\nlines\",DOWN,10.0.0.2:80,2,\n\
               be,s3,,UP,10.0.0.3:80,2,\n";
    let routes = parse_stats(csv, None).unwrap();
    assert_eq!(listed(&routes), ["10.0.0.1:80", "10.0.0.3:80"]);
}

#[test]
fn a_unix_socket_server_is_not_a_pod() {
    let csv = "# pxname,svname,status,addr,type,\nbe,local,UP,unix,2,\n";
    assert!(parse_stats(csv, None).unwrap().is_empty());
}

#[test]
fn an_unreadable_address_of_a_routing_server_is_an_error() {
    let csv = "# pxname,svname,status,addr,type,\nbe,s1,UP,Address family not supported,2,\n";
    assert_eq!(
        parse_stats(csv, None),
        Err(CsvError::BadAddress {
            backend: "be".into(),
            server: "s1".into(),
            addr: "Address family not supported".into()
        })
    );
}

#[test]
fn answers_that_are_not_the_statistics_csv_are_errors() {
    assert_eq!(parse_stats("", None), Err(CsvError::NoHeader));
    assert_eq!(
        parse_stats("<html><body>Statistics Report</body></html>\n", None),
        Err(CsvError::NoHeader)
    );
    assert_eq!(
        parse_stats("# pxname,svname,status\nbe,s1,UP\n", None),
        Err(CsvError::MissingColumn("addr"))
    );
    assert!(matches!(
        parse_stats("# pxname,svname,status,addr\nbe,s1\n", None),
        Err(CsvError::Malformed { row: 2, .. })
    ));
    assert!(matches!(
        parse_stats(
            "# pxname,svname,status,addr\nbe,\"s1,UP,10.0.0.1:80\n",
            None
        ),
        Err(CsvError::Malformed { row: 2, .. })
    ));
}

#[test]
fn every_row_reads_by_column_name_with_its_counters() {
    let rows = stat_rows(STATS).unwrap();
    let backend = rows
        .iter()
        .find(|row| row["pxname"] == "be_web" && row["svname"] == "BACKEND")
        .unwrap();
    for counter in ["hrsp_5xx", "eresp", "econ", "wretr", "wredis"] {
        assert!(backend[counter].parse::<u64>().is_ok(), "{counter}");
    }
    assert!(rows.iter().all(|row| !row.contains_key("")));
    assert_eq!(stat_rows("<html></html>\n"), Err(CsvError::NoHeader));
}
