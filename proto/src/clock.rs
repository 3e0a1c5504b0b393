//! NTP-style clock exchange between a node agent and the controller.
//!
//! The agent sends a request at `t1` (its clock), the controller receives it at `t2` and
//! answers at `t3` (the controller's clock), the agent receives the answer at `t4`. With
//! symmetric network delay the node's clock is ahead of the controller's by
//! `((t1 - t2) + (t4 - t3)) / 2`, and the round trip spent on the network is
//! `(t4 - t1) - (t3 - t2)`. The true offset lies within half a round trip of that estimate,
//! which is why the sample with the smallest round trip is the one to keep.

/// This machine's clock, in nanoseconds since the Unix epoch (the unit of every exchange).
pub fn now_unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The four timestamps of one exchange, in nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// Node clock when the request left.
    pub node_sent: i128,
    /// Controller clock when the request arrived.
    pub controller_received: i128,
    /// Controller clock when the answer left.
    pub controller_sent: i128,
    /// Node clock when the answer arrived.
    pub node_received: i128,
}

/// What one exchange says about the node's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// How far the node's clock is ahead of the controller's (negative: behind), in nanoseconds.
    pub offset_nanos: i128,
    /// Time spent on the network, both ways, in nanoseconds. The offset is exact to within
    /// half of it.
    pub round_trip_nanos: i128,
}

/// Why an exchange cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidExchange {
    /// The node's answer arrived before its request left.
    #[error("the node's clock went backwards during the exchange")]
    NodeClockWentBackwards,
    /// The controller answered before it received the request.
    #[error("the controller's clock went backwards during the exchange")]
    ControllerClockWentBackwards,
    /// The controller spent longer on the request than the whole exchange took.
    #[error("the controller's processing time exceeds the whole exchange")]
    NegativeRoundTrip,
}

impl Exchange {
    /// Computes the offset and round trip of this exchange.
    pub fn sample(&self) -> Result<Sample, InvalidExchange> {
        if self.node_received < self.node_sent {
            return Err(InvalidExchange::NodeClockWentBackwards);
        }
        if self.controller_sent < self.controller_received {
            return Err(InvalidExchange::ControllerClockWentBackwards);
        }
        let round_trip_nanos = (self.node_received - self.node_sent)
            - (self.controller_sent - self.controller_received);
        if round_trip_nanos < 0 {
            return Err(InvalidExchange::NegativeRoundTrip);
        }
        let offset_nanos = ((self.node_sent - self.controller_received)
            + (self.node_received - self.controller_sent))
            / 2;
        Ok(Sample {
            offset_nanos,
            round_trip_nanos,
        })
    }
}

/// Keeps the best sample: the one with the smallest round trip, whose offset is the most
/// trustworthy.
pub fn best_sample(samples: impl IntoIterator<Item = Sample>) -> Option<Sample> {
    samples
        .into_iter()
        .min_by_key(|sample| sample.round_trip_nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i128 = 1_000_000;

    fn exchange(t1: i128, t2: i128, t3: i128, t4: i128) -> Exchange {
        Exchange {
            node_sent: t1 * MS,
            controller_received: t2 * MS,
            controller_sent: t3 * MS,
            node_received: t4 * MS,
        }
    }

    #[test]
    fn offsets_and_round_trips() {
        // (t1, t2, t3, t4) in ms -> (offset ms, round trip ms)
        let table = [
            // clocks agree, 10 ms each way, 2 ms processing
            ((0, 10, 12, 22), (0, 20)),
            // node 30 s ahead
            ((30_000, 10, 12, 30_022), (30_000, 20)),
            // node 30 s behind
            ((-30_000, 10, 12, -29_978), (-30_000, 20)),
            // asymmetric path: 2 ms out, 18 ms back; error is within half the round trip
            ((0, 2, 4, 22), (8, 20)),
            // zero-latency loopback
            ((5, 5, 5, 5), (0, 0)),
        ];
        for ((t1, t2, t3, t4), (offset, round_trip)) in table {
            let sample = exchange(t1, t2, t3, t4).sample().unwrap();
            assert_eq!(
                sample.offset_nanos,
                offset * MS,
                "offset of {t1},{t2},{t3},{t4}"
            );
            assert_eq!(
                sample.round_trip_nanos,
                round_trip * MS,
                "rtt of {t1},{t2},{t3},{t4}"
            );
        }
    }

    #[test]
    fn impossible_exchanges_are_refused() {
        let table = [
            ((10, 0, 1, 5), InvalidExchange::NodeClockWentBackwards),
            ((0, 5, 4, 10), InvalidExchange::ControllerClockWentBackwards),
            ((0, 0, 50, 10), InvalidExchange::NegativeRoundTrip),
        ];
        for ((t1, t2, t3, t4), expected) in table {
            assert_eq!(exchange(t1, t2, t3, t4).sample(), Err(expected));
        }
    }

    #[test]
    fn keeps_the_sample_with_the_smallest_round_trip() {
        let samples = [
            Sample {
                offset_nanos: 900,
                round_trip_nanos: 40,
            },
            Sample {
                offset_nanos: 1000,
                round_trip_nanos: 4,
            },
            Sample {
                offset_nanos: 1200,
                round_trip_nanos: 12,
            },
        ];
        assert_eq!(best_sample(samples).unwrap().offset_nanos, 1000);
        assert_eq!(best_sample([]), None);
    }
}
