"""What only tests, benchmarks and the demo use: development brokers, a throwaway PostgreSQL, free
ports. Nothing in redrive's runtimes imports this room; production never starts a broker."""
