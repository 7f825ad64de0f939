// Package defaults fills a configuration's unset fields: zero means "take
// the default" throughout Aether's options, so one rule serves them all.
package defaults

// Set sets *p to v when *p is its type's zero value.
func Set[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}
