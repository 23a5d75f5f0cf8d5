// Package csisanity runs the CSI community's sanity suite (csi-test) against
// the gpumem CSI node plugin (package csi, served as cmd/gpumem-csi serves
// it). It lives in the deploy module so that the product module does not
// depend on csi-test and Ginkgo.
package csisanity
