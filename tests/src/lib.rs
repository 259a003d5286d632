//! Test support: start real servers on free loopback ports.
