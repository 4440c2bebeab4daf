//! Traffic through the simulated load balancers: the app registry ([`apps`]), the
//! timeline ([`timeline`]) and a generator sending requests at a fixed rate, bounded
//! in count and time, that counts every request a pod cannot answer as a 5xx.

pub mod apps;
pub mod timeline;
