//! The benchmark (being written).
fn main() {}
