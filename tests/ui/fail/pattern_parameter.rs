use lock_core::{LockError, distributed_lock};

pub struct Point {
    pub x: i32,
    pub y: i32,
}

#[distributed_lock(key = "cell:{x}")]
async fn struct_pattern(Point { x, y }: Point) -> Result<i32, LockError> {
    Ok(x + y)
}

#[distributed_lock(key = "pair:{b}")]
async fn tuple_pattern((a, b): (u32, u32)) -> Result<u32, LockError> {
    Ok(a + b)
}

fn main() {}
