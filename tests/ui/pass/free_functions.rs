//! Free functions: every argument, key templates, `?` and `return`
//! converting into the declared error type, attributes kept.
#![deny(warnings)]

use lock_core::{LockError, distributed_lock};
use std::fmt;

#[derive(Debug)]
pub enum BillingError {
    Lock(LockError),
    Declined,
}

impl From<LockError> for BillingError {
    fn from(e: LockError) -> Self {
        BillingError::Lock(e)
    }
}

#[derive(Debug)]
pub struct GatewayError;

impl From<GatewayError> for BillingError {
    fn from(_: GatewayError) -> Self {
        BillingError::Declined
    }
}

pub struct Customer {
    pub id: u64,
    pub region: Region,
}

pub struct Region {
    pub name: String,
}

pub struct Pair(pub u32, pub u32);

pub struct Cents(pub u64);

impl fmt::Display for Cents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}c", self.0)
    }
}

async fn gateway(amount: &Cents) -> Result<u64, GatewayError> {
    if amount.0 == 0 {
        Err(GatewayError)
    } else {
        Ok(amount.0)
    }
}

/// Doc comments stay on the function.
#[distributed_lock(key = "order:{order_id}", ttl = "30s")]
pub async fn charge(order_id: u64, amount: Cents) -> Result<u64, BillingError> {
    // `?` converts `GatewayError` into `BillingError`.
    let charged = gateway(&amount).await?;
    if charged > 1_000_000 {
        return Err(BillingError::Declined);
    }
    // The body may move the parameters the key used.
    drop(amount);
    Ok(charged + order_id)
}

#[distributed_lock(
    fencing = true,
    on_lost = "continue",
    renew = false,
    wait = "0s",
    ttl = "1m30s",
    key = "invoice:{customer.id}:{customer.region.name}:{pair.0}:{{literal}}:{amount}"
)]
pub(crate) async fn every_argument(
    customer: &Customer,
    pair: Pair,
    amount: Cents,
) -> Result<(), LockError> {
    let _ = (customer.id, pair.1, amount.0);
    Ok(())
}

#[distributed_lock(
    key = "abort",
    on_lost = "abort",
    wait = "500ms",
    ttl = "10ms",
    renew = true,
    fencing = false
)]
async fn explicit_defaults() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "nightly-report")]
#[allow(clippy::needless_return)]
async fn fixed_key_and_early_return(skip: bool) -> Result<&'static str, LockError> {
    #![allow(unused_variables)]
    let unused = 1;
    if skip {
        return Ok("skipped");
    }
    Ok("done")
}

#[distributed_lock(key = "diverges")]
async fn body_that_only_returns() -> Result<(), LockError> {
    return Ok(());
}

#[distributed_lock(key = "mut:{items}")]
async fn mutable_parameter(mut items: u32) -> Result<u32, LockError> {
    items += 1;
    Ok(items)
}

/// `std::io::Error` does not convert from `LockError`, but `Box<dyn Error>` does.
#[distributed_lock(key = "boxed")]
async fn boxed_error() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    std::fs::metadata("/")?;
    Ok(())
}

type AppResult<T> = Result<T, BillingError>;

#[distributed_lock(key = "alias")]
async fn result_alias() -> AppResult<u8> {
    Ok(1)
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(charge(1, Cents(5)));
    let customer = Customer {
        id: 1,
        region: Region { name: "eu".into() },
    };
    assert_send(every_argument(&customer, Pair(1, 2), Cents(1)));
    assert_send(explicit_defaults());
    assert_send(fixed_key_and_early_return(true));
    assert_send(body_that_only_returns());
    assert_send(mutable_parameter(1));
    assert_send(boxed_error());
    assert_send(result_alias());
}
