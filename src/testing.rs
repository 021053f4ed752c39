//! Fault injection, for tests of this crate's failure paths (and of code built on it). Not for
//! production use: an armed fault makes the next call that reaches it fail.

use crate::error::Result;
use crate::sys;

/// A place in the shim where a failure can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultPoint {
    /// Right after libtorch's `capture_end` succeeded and the `cudaGraph_t` exists, before it
    /// is instantiated: the path where the graph must be destroyed by the teardown.
    GraphInstantiate,
}

impl FaultPoint {
    fn name(self) -> &'static str {
        match self {
            FaultPoint::GraphInstantiate => "graph_instantiate",
        }
    }
}

/// Makes the next call on this thread that reaches `point` fail as if libtorch had thrown
/// there (`Error::Libtorch`). `None` disarms.
pub fn fail_next(point: Option<FaultPoint>) -> Result<()> {
    sys::error::testing_fail_next(point.map(FaultPoint::name).unwrap_or(""))
}
