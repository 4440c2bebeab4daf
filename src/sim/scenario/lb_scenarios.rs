//! Matrix scenarios about load-balancer and client behaviour (connection-level load
//! balancing, keep-alive clients, long requests, apps with and without a graceful
//! SIGTERM), appended to [`super::matrix::scenarios`].

use super::matrix::Scenario;

/// The load-balancer scenarios, in table order.
pub fn scenarios() -> Vec<Scenario> {
    Vec::new()
}
