"""What gpudiag takes a trace to be before its rules judge it: phases, edges, iterations."""
