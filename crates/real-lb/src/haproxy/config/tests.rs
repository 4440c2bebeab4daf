use super::*;

fn listen() -> Listen {
    Listen {
        frontend: "127.0.0.1:18080".parse().unwrap(),
        stats: "127.0.0.1:18404".parse().unwrap(),
        socket: PathBuf::from("/tmp/lb/haproxy.sock"),
    }
}

fn config() -> HaProxyConfig {
    HaProxyConfig::new(
        "127.0.0.1:10053".parse().unwrap(),
        "web.default.svc.cluster.local",
        8080,
    )
}

/// The lines of `cfg` without their indentation, comments left out.
fn lines(cfg: &str) -> Vec<&str> {
    cfg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn haproxy_s_defaults_are_written_out() {
    let cfg = config().render(&listen()).unwrap();
    let lines = lines(&cfg);
    for line in [
        "nameserver dns 127.0.0.1:10053",
        "accepted_payload_size 512",
        "resolve_retries 3",
        "timeout resolve 1000ms",
        "timeout retry 1000ms",
        "hold valid 10000ms",
        "hold obsolete 0ms",
        "hold nx 30000ms",
        "hold other 30000ms",
        "hold refused 30000ms",
        "hold timeout 30000ms",
        "timeout connect 5000ms",
        "timeout client 50000ms",
        "timeout server 50000ms",
        "retries 3",
        "balance roundrobin",
        "server-template pod 1-8 web.default.svc.cluster.local:8080 resolvers cluster \
         resolve-prefer ipv4 init-addr none check inter 2000ms fall 3 rise 2",
    ] {
        assert!(lines.contains(&line), "{line:?} missing from\n{cfg}");
    }
}

#[test]
fn everything_listens_on_loopback_with_legends_and_an_operator_socket() {
    let cfg = config().render(&listen()).unwrap();
    let lines = lines(&cfg);
    for line in [
        "bind 127.0.0.1:18080",
        "bind 127.0.0.1:18404",
        "stats uri /stats",
        "stats show-legends",
        "stats socket /tmp/lb/haproxy.sock mode 600 level operator",
    ] {
        assert!(lines.contains(&line), "{line:?} missing from\n{cfg}");
    }
    assert_eq!(lines.iter().filter(|l| l.starts_with("bind ")).count(), 2);
}

#[test]
fn retries_on_redispatch_every_retryable_failure_and_off_are_haproxy_s_defaults() {
    let on = config().render(&listen()).unwrap();
    assert!(lines(&on).contains(&"retry-on all-retryable-errors"));
    assert!(lines(&on).contains(&"option redispatch"));
    let off = HaProxyConfig {
        retries: false,
        ..config()
    }
    .render(&listen())
    .unwrap();
    assert!(lines(&off).contains(&"retry-on conn-failure"));
    assert!(lines(&off).contains(&"no option redispatch"));
}

#[test]
fn unrenderable_configurations_are_refused() {
    let no_slots = HaProxyConfig {
        slots: 0,
        ..config()
    };
    assert_eq!(no_slots.render(&listen()), Err(ConfigError::NoSlots));
    let injected = HaProxyConfig::new("127.0.0.1:53".parse().unwrap(), "web\n    option foo", 80);
    assert!(matches!(
        injected.render(&listen()),
        Err(ConfigError::BadName(_))
    ));
    let wide = Listen {
        frontend: "0.0.0.0:80".parse().unwrap(),
        ..listen()
    };
    assert!(matches!(
        config().render(&wide),
        Err(ConfigError::NotLoopback(_))
    ));
}
