//! The wait of [`ProxyMode::Delay`](super::ProxyMode::Delay): tokio's timer
//! rounds every sleep up to the next millisecond (a 250 µs hold became one
//! to two milliseconds), so on Linux each direction of a connection waits on
//! a timerfd of its own, which the kernel fires to the microsecond and the
//! proxy's runtime polls like a socket. Elsewhere, or if a timerfd cannot be
//! had, tokio's timer is used.

use tokio::time::Instant;

/// The timer of one direction of a connection: one wait at a time.
pub(super) struct DeliveryTimer {
    #[cfg(target_os = "linux")]
    precise: Option<linux::TimerFd>,
}

impl DeliveryTimer {
    /// A timer; the timerfd is made on the first wait, so a connection that
    /// never delays costs no descriptor.
    pub(super) fn new() -> Self {
        Self {
            #[cfg(target_os = "linux")]
            precise: None,
        }
    }

    /// Returns at `due` or soon after, never before.
    pub(super) async fn sleep_until(&mut self, due: Instant) {
        #[cfg(target_os = "linux")]
        {
            if self.precise.is_none() {
                self.precise = linux::TimerFd::new().ok();
            }
            if let Some(timer) = &self.precise {
                if timer.sleep_until(due).await.is_ok() {
                    return;
                }
                // A failed timerfd is not tried again on this connection.
                self.precise = None;
            }
        }
        tokio::time::sleep_until(due).await;
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::OwnedFd;

    use rustix::time::{
        Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
        timerfd_settime,
    };
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;
    use tokio::time::Instant;

    /// A non-blocking `CLOCK_MONOTONIC` timerfd registered with the runtime.
    pub(super) struct TimerFd(AsyncFd<OwnedFd>);

    impl TimerFd {
        pub(super) fn new() -> io::Result<Self> {
            let fd = timerfd_create(
                TimerfdClockId::Monotonic,
                TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
            )?;
            // tokio deprecates its safe constructors for types whose
            // descriptor could be swapped or closed while registered (through
            // `get_mut`); the `OwnedFd` here is never reached mutably, and it
            // is closed only after `AsyncFd`'s drop has deregistered it.
            #[allow(deprecated)]
            let fd = AsyncFd::with_interest(fd, Interest::READABLE)?;
            Ok(Self(fd))
        }

        /// Arms the timer for what is left until `due` and waits for it to
        /// fire. Arming again resets the count of expirations, so a wait
        /// cancelled earlier (a mode change) leaves nothing behind; and the
        /// clock is read again after each wake-up, so a stale readiness never
        /// ends a wait early.
        pub(super) async fn sleep_until(&self, due: Instant) -> io::Result<()> {
            loop {
                let left = due.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                let value = Timespec::try_from(left)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "delay too long"))?;
                let spec = Itimerspec {
                    it_interval: Timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    },
                    it_value: value,
                };
                timerfd_settime(self.0.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
                self.fired().await?;
            }
        }

        /// Waits until the timer has fired once, and consumes the expiration.
        async fn fired(&self) -> io::Result<()> {
            let mut expirations = [0u8; 8];
            loop {
                let mut ready = self.0.readable().await?;
                let read = ready.try_io(|fd| {
                    rustix::io::read(fd.get_ref(), &mut expirations).map_err(io::Error::from)
                });
                match read {
                    Ok(Ok(_)) => return Ok(()),
                    Ok(Err(e)) => return Err(e),
                    // Not fired yet: the readiness was stale and is cleared.
                    Err(_would_block) => {}
                }
            }
        }
    }
}
