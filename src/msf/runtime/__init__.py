"""Process plumbing that every stage may use and that uses no stage: spawning and supervising children,
failure reports, CPU affinity and niceness."""
