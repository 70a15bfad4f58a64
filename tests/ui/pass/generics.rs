//! Generic functions, where clauses, lifetimes, reference and `impl Trait`
//! parameters, and an `impl Trait` in the return type.
#![deny(warnings)]

use lock_core::{LockError, distributed_lock};
use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::hash::Hash;

#[distributed_lock(key = "cache:{key}")]
pub async fn generic<K, V>(
    cache: &mut HashMap<K, V>,
    key: K,
    value: V,
) -> Result<Option<V>, LockError>
where
    K: Display + Hash + Eq + Send,
    V: Send,
{
    Ok(cache.insert(key, value))
}

#[distributed_lock(key = "item:{id}")]
pub async fn lifetimes<'a, 'b: 'a>(
    id: &'b str,
    items: &'a [String],
) -> Result<Option<&'a String>, LockError> {
    Ok(items.iter().find(|item| item.as_str() == id))
}

#[distributed_lock(key = "elided:{name}")]
pub async fn elided(name: &str) -> Result<&str, LockError> {
    Ok(name)
}

#[distributed_lock(key = "job:{job}")]
pub async fn impl_trait_param(
    job: impl Display + Send,
    sink: &mut (impl Extend<String> + Send),
) -> Result<(), LockError> {
    sink.extend([job.to_string()]);
    Ok(())
}

#[distributed_lock(key = "shown:{id}")]
pub async fn impl_trait_return(id: u32) -> Result<impl Display + Debug, LockError> {
    Ok(id)
}

async fn fallible() -> Result<u32, LockError> {
    Ok(1)
}

/// `?` still converts: the error type is known from `run`'s bounds.
#[distributed_lock(key = "shown:{id}:try")]
pub async fn impl_trait_return_with_try(id: u32) -> Result<impl Display, LockError> {
    let n = fallible().await?;
    if n == 0 {
        return Ok(id);
    }
    Ok(n + id)
}

pub struct Wrapper<T>(pub T);

impl<T: Display + Sync> Wrapper<T> {
    #[distributed_lock(key = "wrapper:{self.0}")]
    pub async fn get(&self) -> Result<&T, LockError> {
        Ok(&self.0)
    }

    #[distributed_lock(key = "wrapper:{self.0}:new")]
    pub async fn rebuilt(&self) -> Result<Self, LockError>
    where
        T: Clone,
    {
        Ok(Wrapper(self.0.clone()))
    }
}

fn main() {}
