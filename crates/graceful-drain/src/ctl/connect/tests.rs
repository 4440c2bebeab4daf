//! Where the CLI finds its cluster, and what it says when it finds none: each place looked
//! at named once, in one line.

use clap::Parser;

use super::*;
use graceful_drain_core::error::chain;

fn at(path: &str, exists: bool) -> (PathBuf, bool) {
    (PathBuf::from(path), exists)
}

fn home(exists: bool) -> Lookup {
    Lookup {
        home_config: Some(at("/home/ops/.kube/config", exists)),
        ..Lookup::default()
    }
}

#[test]
fn without_any_credentials_the_message_says_once_what_is_missing_and_where_it_looked() {
    let error = home(false).source(false).unwrap_err();
    let message = chain(&error).to_string();
    assert_eq!(
        message,
        "no cluster credentials found: KUBECONFIG is not set, /home/ops/.kube/config does not \
         exist and this is not a pod (KUBERNETES_SERVICE_HOST is not set); pass --kubeconfig \
         FILE or set KUBECONFIG"
    );
    assert_eq!(message.matches(".kube/config").count(), 1, "{message}");
    assert_eq!(message, error.to_string(), "no cause repeats it");

    let listed = Lookup {
        kubeconfig_var: Some(vec![at("/a/kc", false), at("/b/kc", false)]),
        ..home(true)
    };
    assert_eq!(
        listed.source(false).unwrap_err().to_string(),
        "no cluster credentials found: no file KUBECONFIG lists exists (/a/kc, /b/kc) and this \
         is not a pod (KUBERNETES_SERVICE_HOST is not set); pass --kubeconfig FILE or set \
         KUBECONFIG",
        "KUBECONFIG, when set, is all kubectl reads: ~/.kube/config is not a fallback"
    );
    let flag = Lookup {
        flag: Some(at("/tmp/gone.kubeconfig", false)),
        ..home(true)
    };
    assert_eq!(
        flag.source(false).unwrap_err().to_string(),
        "kubeconfig /tmp/gone.kubeconfig (from --kubeconfig) does not exist"
    );
}

#[test]
fn the_sources_come_in_kubectls_order() {
    let flag = Lookup {
        flag: Some(at("/tmp/kc", true)),
        kubeconfig_var: Some(vec![at("/a/kc", true)]),
        in_cluster: true,
        ..home(true)
    };
    assert_eq!(
        flag.source(false).unwrap(),
        Source::Files(vec!["/tmp/kc".into()])
    );
    let var = Lookup {
        flag: None,
        kubeconfig_var: Some(vec![
            at("/a/kc", false),
            at("/b/kc", true),
            at("/c/kc", true),
        ]),
        ..flag.clone()
    };
    assert_eq!(
        var.source(false).unwrap(),
        Source::Files(vec!["/b/kc".into(), "/c/kc".into()]),
        "the files that exist, merged in order; missing ones are skipped as kubectl does"
    );
    assert_eq!(
        home(true).source(false).unwrap(),
        Source::Files(vec!["/home/ops/.kube/config".into()])
    );
    let pod = Lookup {
        in_cluster: true,
        ..home(false)
    };
    assert_eq!(pod.source(false).unwrap(), Source::InCluster);
    let message = pod.source(true).unwrap_err().to_string();
    assert!(
        message.contains("the pod's service account has no contexts, clusters or users"),
        "--context in a pod without a kubeconfig: {message}"
    );
}

#[test]
fn a_context_cluster_or_user_the_kubeconfig_lacks_is_named_with_the_ones_it_has() {
    let kubeconfig = Kubeconfig::from_yaml(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: prod, cluster: {server: 'https://prod:6443'}}]\n\
         users: [{name: admin, user: {token: t}}]\n\
         contexts: [{name: prod, context: {cluster: prod, user: admin}},\n\
                    {name: stage, context: {cluster: prod, user: admin}}]\n\
         current-context: prod\n",
    )
    .unwrap();
    let options = |context: Option<&str>, user: Option<&str>| KubeConfigOptions {
        context: context.map(str::to_string),
        cluster: None,
        user: user.map(str::to_string),
    };
    assert!(check_selection(&kubeconfig, &options(Some("stage"), Some("admin")), "kc").is_ok());
    let error =
        check_selection(&kubeconfig, &options(Some("dev"), None), "/home/ops/kc").unwrap_err();
    assert_eq!(
        error.to_string(),
        "no context \"dev\" in kubeconfig /home/ops/kc (it has: prod, stage)"
    );
    let error = check_selection(&kubeconfig, &options(None, Some("root")), "kc").unwrap_err();
    assert_eq!(
        error.to_string(),
        "no user \"root\" in kubeconfig kc (it has: admin)"
    );
}

#[test]
fn the_connection_flags_are_kubectls() {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        connect: ConnectArgs,
    }
    let cli = Cli::try_parse_from([
        "x",
        "--kubeconfig",
        "/tmp/kc",
        "--context=prod",
        "--cluster",
        "east",
        "--user",
        "admin",
    ])
    .unwrap();
    assert_eq!(cli.connect.kubeconfig, Some(PathBuf::from("/tmp/kc")));
    let options = cli.connect.options();
    assert_eq!(
        (options.context, options.cluster, options.user),
        (
            Some("prod".into()),
            Some("east".into()),
            Some("admin".into())
        )
    );
    assert!(cli.connect.selects());
    assert!(!ConnectArgs::default().selects());
}
