package main

func benchCmd(args []string) error { return usageError{"bench: not yet"} }
