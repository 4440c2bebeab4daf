//! The admission server: [`crate::transport`] (connections, TLS, bounds) serving
//! [`crate::admission`]'s router (the endpoints and their answers).

pub use crate::admission::{AppState, Holds, MAX_HELD_DELETES, router};
pub use crate::transport::{Error, serve};
