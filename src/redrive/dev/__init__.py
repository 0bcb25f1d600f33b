"""What only tests, benchmarks and the demo use: development brokers, a throwaway PostgreSQL, a
local Spark Connect server and standalone cluster, free ports. Nothing in redrive's runtimes
imports this room; production never starts a broker or a Spark server."""
