use std::net::IpAddr;

use axum::body::{Body, Bytes};

use super::*;

/// A body that sends `bytes` and then neither ends nor fails while its sender lives.
fn stalled_body(
    bytes: usize,
) -> (
    Body,
    tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.try_send(Ok(Bytes::from(vec![b' '; bytes]))).unwrap();
    let chunks = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    (Body::from_stream(chunks), tx)
}

/// Four addresses whose bodies hold all of the budget but a few bytes, and will until
/// their bodies time out, cannot keep out a request from an address that holds less:
/// the bodies of one of them are stopped (503) and the request is read. Without that it
/// waited [`BUDGET_WAIT`] and got 503 itself, and kube-apiserver let the call through
/// unprotected.
#[tokio::test(start_paused = true)]
async fn addresses_that_take_the_whole_budget_cannot_keep_out_one_that_holds_less() {
    let budget = Budget::new(1 << 20);
    let mut senders = Vec::new();
    let mut attackers = Vec::new();
    for n in 1..=4 {
        // A body of unknown length is charged twice what arrives.
        let (body, tx) = stalled_body((128 << 10) - 1);
        senders.push(tx);
        let budget = budget.clone();
        let charge = budget.charge(Some(IpAddr::from([10, 0, 0, n])));
        attackers.push(tokio::spawn(async move {
            read_body(body, &budget, charge, 4 << 20).await.map(|_| ())
        }));
    }
    for _ in 0..10_000 {
        if budget.all.available_permits() < 1024 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        budget.all.available_permits(),
        8,
        "the bodies did not take the budget"
    );

    let api_server = budget.charge(Some(IpAddr::from([10, 0, 1, 1])));
    let review = read_body(Body::from(vec![b' '; 1024]), &budget, api_server, 4 << 20).await;
    let (bytes, _charge) = review.expect("the review was kept out");
    assert_eq!(bytes.len(), 1024);

    let mut stopped = Vec::new();
    for attacker in attackers {
        match attacker.await.unwrap() {
            Err(BodyError::Budget(Exhausted::Stopped { peer })) => stopped.push(peer),
            Err(BodyError::TooSlow) => {}
            other => panic!("an attacker's body ended {other:?}"),
        }
    }
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    drop(senders);
}

/// A request from the address that holds the most stops nobody: it waits for the budget
/// like any other, and gets 503 when none comes back.
#[tokio::test(start_paused = true)]
async fn the_largest_holder_cannot_stop_those_holding_less() {
    let budget = Budget::new(1 << 20);
    let big = IpAddr::from([10, 0, 0, 1]);
    let small = IpAddr::from([10, 0, 0, 2]);
    let (body, _big_sender) = stalled_body((384 << 10) - 1);
    let held = {
        let budget = budget.clone();
        let charge = budget.charge(Some(big));
        tokio::spawn(async move { read_body(body, &budget, charge, 4 << 20).await.map(|_| ()) })
    };
    let (body, _small_sender) = stalled_body((128 << 10) - 1);
    let other = {
        let budget = budget.clone();
        let charge = budget.charge(Some(small));
        tokio::spawn(async move { read_body(body, &budget, charge, 4 << 20).await.map(|_| ()) })
    };
    for _ in 0..10_000 {
        if budget.all.available_permits() < 1024 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(budget.all.available_permits(), 4);
    let more = read_body(
        Body::from(vec![b' '; 1024]),
        &budget,
        budget.charge(Some(big)),
        4 << 20,
    )
    .await;
    assert!(
        matches!(more, Err(BodyError::Budget(Exhausted::Budget { .. }))),
        "{more:?}"
    );
    assert!(matches!(other.await.unwrap(), Err(BodyError::TooSlow)));
    assert!(matches!(held.await.unwrap(), Err(BodyError::TooSlow)));
}
