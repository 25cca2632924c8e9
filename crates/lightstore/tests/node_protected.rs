//! Protected mode and where passwords come from: a node on a non-loopback
//! address without a password refuses remote clients with a clear error
//! (loopback and Unix-socket clients are served); a password from the
//! environment or `--protected-mode no` lets them in; the `lightstore`
//! cluster tools take their password from `LIGHTSTORE_PASSWORD`.

mod node_support;

use std::io::{BufReader, Read};
use std::net::{IpAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use node_support::{call, Node, Resp};

/// An address of this machine that is not loopback (every machine with a
/// network interface has one; the test fails rather than skips without it).
fn non_loopback_addr() -> IpAddr {
    // Connecting a UDP socket sends nothing; it only picks the source
    // address the kernel would route from.
    let routed = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.200:9").map(|()| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip());
    match routed {
        Ok(ip) if !ip.is_loopback() && !ip.is_unspecified() => ip,
        other => panic!("this machine has no non-loopback IPv4 address ({other:?})"),
    }
}

fn remote_connect(port: u16) -> TcpStream {
    let s = TcpStream::connect((non_loopback_addr(), port))
        .expect("connect from a non-loopback address");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn stat(n: &Node, name: &str) -> String {
    let info = n.cli(&["info", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("{name} not in INFO stats:\n{info}"))
        .trim()
        .to_string()
}

#[test]
fn protected_mode_refuses_remote_clients_without_a_password() {
    let tmp = tempfile::tempdir().unwrap();
    let n = Node::start_at(tmp.path(), "0.0.0.0:0", &[]).expect("node starts");
    assert!(
        n.log_text().contains("protected mode"),
        "the start-up warning names protected mode:\n{}",
        n.log_text()
    );
    let mut remote = remote_connect(n.port);
    let mut refused = String::new();
    remote
        .read_to_string(&mut refused)
        .expect("the node closes after its error");
    assert!(refused.starts_with("-DENIED"), "{refused:?}");
    for way_out in [
        "--requirepass",
        "--protected-mode no",
        "LIGHTSTORE_REQUIREPASS",
    ] {
        assert!(
            refused.contains(way_out),
            "{way_out} missing from {refused:?}"
        );
    }
    // Loopback clients are served as before.
    assert_eq!(n.cli(&["set", "k", "v"]), "OK");
    assert_eq!(n.cli(&["get", "k"]), "v");
    assert_eq!(stat(&n, "rejected_protected_mode"), "1");
    assert_eq!(
        n.cli(&["config", "get", "protected-mode"]),
        "protected-mode\nyes"
    );
}

#[test]
fn a_password_from_the_environment_lets_remote_clients_authenticate() {
    let tmp = tempfile::tempdir().unwrap();
    let n = Node::start_with_env(
        tmp.path(),
        "0.0.0.0:0",
        &[],
        &[("LIGHTSTORE_REQUIREPASS", "env-s3cret")],
    )
    .expect("node starts");
    let mut c = BufReader::new(remote_connect(n.port));
    assert!(matches!(call(&mut c, &[b"GET", b"k"]), Resp::Error(e) if e.starts_with("NOAUTH")));
    assert_eq!(
        call(&mut c, &[b"AUTH", b"env-s3cret"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        call(&mut c, &[b"SET", b"k", b"v"]),
        Resp::Simple("OK".into())
    );
    // The password is not on the node's command line.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", n.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("env-s3cret"));
}

#[test]
fn protected_mode_no_serves_remote_clients() {
    let tmp = tempfile::tempdir().unwrap();
    let n =
        Node::start_at(tmp.path(), "0.0.0.0:0", &["--protected-mode", "no"]).expect("node starts");
    assert!(
        n.log_text().contains("WITHOUT a password"),
        "{}",
        n.log_text()
    );
    let mut c = BufReader::new(remote_connect(n.port));
    assert_eq!(call(&mut c, &[b"PING"]), Resp::Simple("PONG".into()));
    assert_eq!(stat(&n, "rejected_protected_mode"), "0");
}

#[test]
fn protected_mode_is_read_from_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("node.toml");
    std::fs::write(&conf, "protected_mode = false\n").unwrap();
    let data = tmp.path().join("data");
    let n = Node::start_at(&data, "0.0.0.0:0", &["--config", conf.to_str().unwrap()])
        .expect("node starts");
    let mut c = BufReader::new(remote_connect(n.port));
    assert_eq!(call(&mut c, &[b"PING"]), Resp::Simple("PONG".into()));
}

#[test]
fn cluster_tools_take_the_password_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let n = Node::start_in(tmp.path(), &["--requirepass", "pw-from-env"]).expect("node starts");
    let nodes = format!("127.0.0.1:{}", n.port);
    let run = |password: Option<&str>, args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lightstore"));
        cmd.args(["cluster", "--nodes", &nodes]).args(args);
        cmd.env_remove("LIGHTSTORE_PASSWORD");
        if let Some(p) = password {
            cmd.env("LIGHTSTORE_PASSWORD", p);
        }
        cmd.output().expect("lightstore runs")
    };
    let denied = run(None, &["set", "k", "v"]);
    assert!(!denied.status.success());
    let text = String::from_utf8_lossy(&denied.stderr);
    assert!(text.contains("NOAUTH") || text.contains("auth"), "{text}");
    let ok = run(Some("pw-from-env"), &["set", "k", "v"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let got = run(Some("pw-from-env"), &["get", "k"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "v");
}
