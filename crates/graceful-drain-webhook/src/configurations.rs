//! Where the API server sends the reviews. The two webhook configurations themselves are
//! the chart's alone (charts/graceful-drain/templates/webhook-configurations.yaml): every
//! cluster of the tests registers them as the chart renders them, and
//! `.ci/checks/shipped.sh` fails when the two differ, so no second copy is built here.

/// Path of the mutating (eviction) endpoint, the chart's `/mutate/eviction`.
pub const EVICTION_PATH: &str = "/mutate/eviction";
/// Path of the validating (delete) endpoint, the chart's `/validate/delete`.
pub const DELETE_PATH: &str = "/validate/delete";
