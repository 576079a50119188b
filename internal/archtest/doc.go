// Package archtest fails the build's tests when a package imports what the
// architecture forbids (see its test and the README's architecture
// section); it has no code of its own.
package archtest
