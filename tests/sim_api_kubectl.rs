use graceful_drain::runtime::Shutdown;
use graceful_drain::sim::apiserver::{ApiServer, Config};

#[tokio::test]
async fn explore() {
    let shutdown = Shutdown::new();
    let api = ApiServer::start(Config::default(), shutdown.clone())
        .await
        .unwrap();
    api.write_kubeconfig(std::path::Path::new("/tmp/simkc"), "admin")
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(300)).await;
}
